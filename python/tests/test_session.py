"""Several real processes under `shmbroker run`, each running a scenario of workers.py."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, WORKERS, assert_ok, clean_env, describe, launcher, run_job, run_scenario
from workers import RECEIVE_FORMS


def test_collectives_and_messages_at_every_size_with_every_buffer_type():
    # 0 B to 4 MiB (inline, eager, pipelined > 64 KiB), as bytes, bytearray, memoryview, a
    # memoryview window and array.array, with 3 ranks and every root.
    assert_ok(run_scenario(3, "collectives"), 3, "collectives")


def test_messages_larger_than_the_outbox():
    # A 1 MiB outbox: the 1 MiB and 4 MiB messages do not fit in it.
    job = run_scenario(3, "collectives", env={"SHMBROKER_OUTBOX_BYTES": str(1 << 20)})
    assert_ok(job, 3, "collectives")


def test_numpy_arrays():
    pytest.importorskip("numpy")
    assert_ok(run_scenario(2, "numpy"), 2, "numpy")


def test_reductions_scatter_and_all_to_all():
    # 2 ranks: 1.5 + 1.5 is 3.0, 0x4040 in bfloat16, which the scenario checks for.
    assert_ok(run_scenario(2, "reductions"), 2, "reductions")


def test_groups_and_shrinking_after_a_death():
    # 4 ranks: collectives on disjoint and overlapping groups; then rank 3 is killed, and the
    # others shrink and sum among themselves.
    job = run_scenario(4, "groups")
    assert job.returncode == 137, describe(job)
    for rank in range(3):
        assert f"[{rank}] OK groups rank {rank}" in job.stdout, describe(job)


def test_survivors_and_a_replacement_regroup_while_a_rank_dies():
    # Rank 1 dies 300 ms after a send while rank 2 already recovers the world's group; the
    # launcher starts it again and every rank ends in one group of the same processes.
    for _ in range(3):
        job = run_scenario(3, "regroup", options=("--restart", "1"))
        assert_ok(job, 3, "regroup")


def test_a_member_that_passes_other_ranks_is_named():
    job = run_scenario(3, "group_mismatch")
    assert_ok(job, 3, "group_mismatch")
    for rank, named in ((0, 2), (1, 2), (2, 0)):
        assert f"[{rank}] MISMATCH {named}" in job.stdout, describe(job)


def test_recv_into_recv_any_try_recv_and_probe():
    assert_ok(run_scenario(3, "receives"), 3, "receives")


def test_a_split_receive_never_waits_behind_a_send_and_halves_rejoin(tmp_path):
    # A 1 MiB outbox: two of rank 0's 400 KiB broadcasts fit, the third waits for rank 1.
    job = run_scenario(
        3, "split", tmp_path / "replied", env={"SHMBROKER_OUTBOX_BYTES": str(1 << 20)}
    )
    assert_ok(job, 3, "split")


def test_typed_channels_carry_structured_records_and_refuse_a_tag_they_do_not_share():
    assert_ok(run_scenario(3, "channels"), 3, "channels")


def test_bad_arguments_raise_and_leave_the_session_usable():
    assert_ok(run_scenario(2, "arguments"), 2, "arguments")


def test_a_world_of_one():
    assert_ok(run_scenario(1, "solo"), 1, "solo")


def test_exchange_fds_of_memfds():
    assert_ok(run_scenario(3, "fds"), 3, "fds")


def test_an_fd_batch_a_rank_has_no_room_for_fails_on_every_rank_naming_it():
    assert_ok(run_scenario(2, "fds_exhausted"), 2, "fds_exhausted")


def test_a_killed_peer_is_peer_lost_naming_its_rank():
    job = run_scenario(3, "peer_lost")
    # The job's status is the killed copy's: 128 + SIGKILL.
    assert job.returncode == 137, describe(job)
    assert "rank 2 was killed by SIGKILL" in job.stderr, describe(job)
    for rank in (0, 1):
        assert f"[{rank}] PEERLOST rank 2: peer rank 2 was lost" in job.stdout, describe(job)
        assert f"[{rank}] OK peer_lost rank {rank}" in job.stdout, describe(job)


def test_a_peer_that_closes_is_peer_left_naming_its_rank():
    job = run_scenario(3, "peer_left")
    assert_ok(job, 3, "peer_left")
    for rank in (0, 1):
        assert f"[{rank}] PEERLEFT rank 2: peer rank 2 left the session" in job.stdout


def test_a_rank_that_never_came_before_one_left_is_peer_never_joined(tmp_path):
    job = run_scenario(3, "never_joined", str(tmp_path))
    assert_ok(job, 3, "never_joined")
    assert (
        "[0] NEVERJOINED rank 1: peer rank 1 never logged on, and no longer can: "
        "the job was closed to newcomers when rank 2 left"
    ) in job.stdout, describe(job)


def test_a_deadline_is_timeout_naming_the_op_and_ranks():
    job = run_scenario(2, "timeout")
    assert_ok(job, 2, "timeout")
    assert "[0] TIMEOUT recv [1]: recv timed out after 300ms waiting for rank 1" in job.stdout


def test_the_context_manager_closes_and_calls_after_close_raise():
    job = run_scenario(2, "context")
    assert_ok(job, 2, "context")
    assert "[0] CLOSED rank 0" in job.stdout and "[1] CLOSED rank 1" in job.stdout


def test_the_gil_is_released_while_a_call_waits(tmp_path):
    job = run_scenario(2, "gil", tmp_path)
    assert_ok(job, 2, "gil")
    assert "[0] GIL released" in job.stdout


def test_a_forked_child_cannot_use_or_end_its_parents_session():
    assert_ok(run_scenario(2, "fork"), 2, "fork")


def test_different_collectives_are_a_protocol_error_naming_the_peer():
    job = run_scenario(2, "mismatch")
    assert_ok(job, 2, "mismatch")
    assert "[0] MISMATCH rank 1: rank 1 called all_gather #0" in job.stdout, describe(job)
    assert "[1] MISMATCH rank 0: rank 0 called barrier #0" in job.stdout, describe(job)


def test_ctrl_c_interrupts_a_wait(tmp_path):
    # Rank 1 waits in recv (60 s deadline) and gets SIGINT: KeyboardInterrupt within 10 s, and
    # the session goes on (a message sent afterwards arrives).
    job = run_scenario(2, "interrupt", tmp_path)
    assert_ok(job, 2, "interrupt")
    assert "[1] INTERRUPTED" in job.stdout
    assert "[1] RECEIVED after the interrupt" in job.stdout


def test_ctrl_c_never_throws_away_a_call_that_succeeded(tmp_path):
    # SIGINT lands while rank 1's 64 MiB send is under way: the send returns, the next call
    # raises KeyboardInterrupt, and rank 0 receives the message once.
    job = run_scenario(2, "interrupt_send", tmp_path)
    assert_ok(job, 2, "interrupt_send")
    assert "[1] SEND RETURNED" in job.stdout, describe(job)
    assert "[1] NEXT CALL INTERRUPTED" in job.stdout, describe(job)
    assert "[0] RECEIVED ONCE" in job.stdout, describe(job)


@pytest.mark.parametrize("form", RECEIVE_FORMS)
def test_ctrl_c_during_a_large_receive_loses_no_message(tmp_path, form):
    # Issue 42: 64 MiB messages (32 MiB loans), one SIGINT at a random moment of each receive,
    # the receiver retrying on KeyboardInterrupt: every message arrives once, whole, in order,
    # and every SIGINT comes out. SHMBROKER_INTERRUPT_MESSAGES sets the count (a longer run).
    count = os.environ.get("SHMBROKER_INTERRUPT_MESSAGES", "8")
    job = run_scenario(3, "interrupt_receives", tmp_path, form, count)
    assert f"[1] INTERRUPTS {form}: " in job.stdout, describe(job)
    print(next(line for line in job.stdout.splitlines() if "INTERRUPTS" in line))
    assert_ok(job, 3, "interrupt_receives")


def test_log_events_reach_pythons_logging():
    job = run_scenario(2, "logs", env={"SHMBROKER_FD_TRANSPORT": "relay"})
    assert_ok(job, 2, "logs")
    assert "[1] LOGGED fd transport: relay through the broker" in job.stdout, describe(job)


def test_gpu_handles_with_their_fds():
    assert_ok(run_scenario(3, "gpu_handles"), 3, "gpu_handles")


def test_loans_by_reference_and_slices_that_outlive_them():
    job = run_scenario(3, "loans")
    assert_ok(job, 3, "loans")
    assert "[0] PINNED slice read after close" in job.stdout, describe(job)


def test_symmetric_buffers_are_read_in_place():
    job = run_scenario(3, "symmetric")
    assert_ok(job, 3, "symmetric")
    assert "[0] SYMMETRIC 15" in job.stdout, describe(job)


def test_a_timeout_says_what_the_rank_it_waited_for_is_doing():
    pytest.importorskip("numpy")
    idle = run_scenario(3, "stuck_idle")
    assert_ok(idle, 3, "stuck_idle")
    busy = run_scenario(3, "stuck_recv")
    assert_ok(busy, 3, "stuck_recv")
    for rank in (0, 1):
        said = f"[{rank}] IDLE rank 2 is in no call (its last, all_reduce #0, finished "
        assert said in idle.stdout, describe(idle)
        assert f"[{rank}] BUSY rank 2 is in recv from rank 1 for " in busy.stdout, describe(busy)


def test_status_says_who_is_where():
    job = run_scenario(3, "status")
    assert_ok(job, 3, "status")
    assert "[0] STATUS barrier #1 running" in job.stdout, describe(job)


def test_mismatched_collectives_fail_at_once_naming_both_calls(tmp_path):
    job = run_scenario(2, "mismatch_waiting", str(tmp_path))
    assert_ok(job, 2, "mismatch_waiting")
    assert "[0] MISMATCH rank 1 called gather #1 while this rank called broadcast #1" in job.stdout
    assert "[1] MISMATCH rank 0 called broadcast #1 while this rank called gather #1" in job.stdout


def test_a_peer_that_gave_a_collective_up_is_peer_gave_up_naming_it(tmp_path):
    job = run_scenario(3, "gave_up", str(tmp_path))
    assert_ok(job, 3, "gave_up")
    for rank in (0, 2):
        assert (
            f"[{rank}] GAVEUP peer rank 1 gave up on all_reduce #1 (its own call failed naming "
            "rank 2)" in job.stdout
        ), describe(job)


def test_a_wait_with_no_deadline_has_a_watchdog():
    job = run_scenario(2, "watchdog", env={"SHMBROKER_WARN_AFTER": "0.5"})
    assert_ok(job, 2, "watchdog")
    assert "[0] WARNED recv has waited" in job.stdout, describe(job)


def test_the_issue_one_liner_all_gathers():
    program = (
        "import shmbroker; s = shmbroker.connect(); "
        "print('gathered', s.all_gather(b'%d' % s.rank))"
    )
    job = run_job(3, "-c", program)
    assert job.returncode == 0, describe(job)
    for rank in range(3):
        assert f"[{rank}] gathered [b'0', b'1', b'2']" in job.stdout, describe(job)


def test_the_readme_program(tmp_path):
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Python", 1)[1]
    program = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    path = tmp_path / "prog.py"
    path.write_text(program)
    job = run_job(3, path)
    assert job.returncode == 0, describe(job)
    assert "[0] rank 0 of 3" in job.stdout, describe(job)


def test_objects_with_out_of_band_buffers_and_a_forged_header():
    assert_ok(run_scenario(3, "objects"), 3, "objects")


def test_recv_any_async_serves_an_event_loop_and_a_death_ends_it():
    # 3 ranks: rank 2 is killed after its message; rank 0 reports the death and finishes.
    job = run_scenario(3, "asyncio")
    assert job.returncode == 137, describe(job)
    assert "[0] ASYNC PEERLOST rank 2" in job.stdout, describe(job)
    assert "[0] OK asyncio rank 0" in job.stdout, describe(job)


def test_a_dead_ranks_replacement_rejoins(tmp_path):
    # A broker of its own (`shmbroker serve`), no launcher: rank 1 dies, a new process rejoins
    # as rank 1 naming the job, and rank 0 hears PeerLost, then PeerRejoined, then its hello.
    socket = tmp_path / "broker.sock"
    env = clean_env({"SHMBROKER_JOB": "python-rejoin"})
    broker = subprocess.Popen(
        [str(launcher()), "serve", "--socket", str(socket), "--workers", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    survivor = None
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            assert time.monotonic() < deadline, "the broker never made its socket"
            time.sleep(0.01)
        part = lambda name: [sys.executable, str(WORKERS), "rejoin", name, str(socket)]
        survivor = subprocess.Popen(
            part("survivor"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        victim = subprocess.run(part("victim"), env=env, capture_output=True, text=True, timeout=60)
        assert victim.returncode == -signal.SIGKILL, victim.stderr
        newcomer = subprocess.run(
            part("newcomer"), env=env, capture_output=True, text=True, timeout=60
        )
        assert newcomer.returncode == 0, newcomer.stdout + newcomer.stderr
        out, err = survivor.communicate(timeout=60)
        assert survivor.returncode == 0 and "REJOINED" in out, out + err
    finally:
        for process in (survivor, broker):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
