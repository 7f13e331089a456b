"""The torch.distributed backend: against gloo under `shmbroker run`, under torchrun, through
torch's store with no launcher, and a rank's death. Skipped when torch is not installed, unless
SHMBROKER_REQUIRE_TORCH=1 (as in CI) makes that a failure."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import assert_ok, clean_env, describe, run_job

if os.environ.get("SHMBROKER_REQUIRE_TORCH") == "1":
    import torch  # noqa: F401  (fails the run when torch is missing)
else:
    pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

WORKERS = Path(__file__).with_name("torch_workers.py")
DEADLINE = 120


@pytest.mark.parametrize("copies", [2, 3, 4])
def test_every_call_gives_what_gloo_gives(copies):
    job = run_job(copies, WORKERS, "against_gloo", timeout=DEADLINE)
    assert_ok(job, copies, "against_gloo")


def test_tags_coalesced_gathers_monitored_barriers_and_timeouts_work_as_under_gloo():
    job = run_job(3, WORKERS, "trips", timeout=DEADLINE)
    assert_ok(job, 3, "trips")


def test_the_group_destroyed_and_made_again_under_the_launcher():
    job = run_job(2, WORKERS, "again", timeout=DEADLINE)
    assert_ok(job, 2, "again")


def test_the_group_destroyed_and_made_again_through_the_store():
    results = finish(start_ranks("again", 2))
    for rank, (status, out, err) in enumerate(results):
        assert status == 0 and f"OK again rank {rank}" in out, (status, out, err)


def test_under_torchrun():
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(WORKERS),
            "basic",
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )
    assert job.returncode == 0, describe(job)
    for rank in range(2):
        assert f"OK basic rank {rank}" in job.stdout, describe(job)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_ranks(scenario, copies):
    """`copies` workers with no launcher: torch's TCP store tells them where the broker is."""
    init = f"tcp://127.0.0.1:{free_port()}"
    return [
        subprocess.Popen(
            [sys.executable, str(WORKERS), scenario, str(rank), str(copies), init],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
        )
        for rank in range(copies)
    ]


def finish(ranks):
    """Each worker's (exit status, stdout, stderr), waiting with a deadline and killing the
    rest on the way out."""
    results = []
    try:
        for rank in ranks:
            out, err = rank.communicate(timeout=DEADLINE)
            results.append((rank.returncode, out, err))
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    return results


def test_with_no_launcher_through_torchs_store():
    results = finish(start_ranks("basic", 3))
    for rank, (status, out, err) in enumerate(results):
        assert status == 0 and f"OK basic rank {rank}" in out, (status, out, err)


def test_a_rank_that_dies_is_named_by_the_others():
    results = finish(start_ranks("death", 3))
    assert results[1][0] == 3, results[1]
    for rank in (0, 2):
        status, out, err = results[rank]
        assert status == 0 and f"OK death rank {rank}" in out, (status, out, err)


# --- a world spanning nodes: SHMBROKER_NODE makes several "nodes" on this machine.

LAYOUTS = {
    "2 nodes x 2, in blocks": ["a", "a", "b", "b"],
    "2 nodes x 2, interleaved": ["a", "b", "a", "b"],
    "3 nodes x 2": ["a", "a", "b", "b", "c", "c"],
    "1 + 2, uneven": ["a", "b", "b"],
}


def start_nodes(scenario, nodes, extra=None):
    """One worker per entry of `nodes` (its node's name) with no launcher, on a store this test
    hosts (as torchrun's agent does, so that it outlives any rank)."""
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1",
        0,
        len(nodes),
        True,
        timeout=datetime.timedelta(seconds=DEADLINE),
        wait_for_workers=False,
    )
    ranks = [
        subprocess.Popen(
            [sys.executable, str(WORKERS), scenario, str(rank), str(len(nodes))]
            + [f"store:{store.port}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env({"SHMBROKER_NODE": f"node{ord(node) - ord('a')}", **(extra or {})}),
            stdin=subprocess.DEVNULL,
        )
        for rank, node in enumerate(nodes)
    ]
    return store, ranks


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_world_spanning_nodes_gives_what_gloo_gives(layout):
    _store, ranks = start_nodes("spanning", LAYOUTS[layout])
    for rank, (status, out, err) in enumerate(finish(ranks)):
        assert status == 0 and f"OK spanning rank {rank}" in out, (status, out, err[-3000:])


@pytest.mark.parametrize(
    "nodes, victim",
    [("aabb", 1), ("aabb", 2), ("abb", 0)],
    ids=["a node's second rank", "a node's leader", "a node of one rank"],
)
@pytest.mark.parametrize("late", ["0", "1"], ids=["small all-reduces", "large all-reduces"])
def test_a_death_on_one_node_ends_every_node_within_5_s(nodes, victim, late, tmp_path):
    """A death a node peer sees is named on every node (PeerLost); one no node peer sees (a
    node of one rank) ends every call with an error that says so."""
    died_at = tmp_path / "died"
    alone = "1" if nodes.count(nodes[victim]) == 1 else "0"
    extra = {"VICTIM": str(victim), "LATE": late, "DIED_AT": str(died_at), "ALONE": alone}
    _store, ranks = start_nodes("span_death", list(nodes), extra)
    results = finish(ranks)
    assert results[victim][0] == 3, results[victim]
    died = float(died_at.read_text())
    for rank, (status, out, err) in enumerate(results):
        if rank == victim:
            continue
        assert status == 0 and f"OK span_death rank {rank}" in out, (status, out, err[-3000:])
        learned = float(out.split("learned at ")[1].split(":")[0])
        assert learned - died < 5, f"rank {rank} learned of the death {learned - died:.1f} s on"


def test_two_torchruns_as_two_nodes():
    port = free_port()
    jobs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"localhost:{port}",
                "--rdzv-id",
                "two-nodes",
                str(WORKERS),
                "spanning",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env({"SHMBROKER_NODE": f"node{node}"}),
            stdin=subprocess.DEVNULL,
        )
        for node in range(2)
    ]
    results = finish(jobs)
    out = "".join(result[1] for result in results)
    for status, _, err in results:
        assert status == 0, err[-3000:]
    for rank in range(4):
        assert f"OK spanning rank {rank}" in out, out


@pytest.mark.parametrize("victim", [1, 2], ids=["a node's second rank", "a node's leader"])
def test_a_stopped_rank_is_named_on_every_node(victim):
    extra = {"VICTIM": str(victim), "TIMEOUT_S": "3"}
    _store, ranks = start_nodes("span_stop", ["a", "a", "b", "b"], extra)
    survivors = [process for rank, process in enumerate(ranks) if rank != victim]
    try:
        results = finish(survivors)
    finally:
        ranks[victim].kill()
        ranks[victim].wait()
    for rank, (status, out, err) in zip([r for r in range(4) if r != victim], results):
        assert status == 0 and f"OK span_stop rank {rank}" in out, (status, out, err[-3000:])


@pytest.mark.parametrize("trial", range(6))
def test_a_rank_killed_at_a_random_moment_is_named_on_every_node(trial):
    """Mixed calls on 2 nodes of 2 ranks; a random rank is killed (SIGKILL) at a random moment,
    maybe in the middle of a call. Every other rank raises PeerLost naming it; none hangs."""
    import random
    import select
    import time

    chance = random.Random(4600 + trial)
    victim, delay = chance.randrange(4), chance.uniform(0.05, 1.5)
    _store, ranks = start_nodes("span_chaos", ["a", "a", "b", "b"], {"VICTIM": str(victim)})
    try:
        # Every rank says READY once the world is made; then the victim dies.
        ready, deadline = set(), time.monotonic() + DEADLINE
        while len(ready) < len(ranks) and time.monotonic() < deadline:
            for rank, process in enumerate(ranks):
                if rank not in ready and select.select([process.stdout], [], [], 0.05)[0]:
                    if process.stdout.readline().strip() == "READY":
                        ready.add(rank)
                assert process.poll() is None, (rank, process.stderr.read()[-3000:])
        assert len(ready) == len(ranks), f"only {sorted(ready)} were ready"
        time.sleep(delay)
        ranks[victim].kill()
    finally:
        results = finish(ranks)
    for rank, (status, out, err) in enumerate(results):
        if rank != victim:
            what = f"trial {trial}: victim {victim} after {delay:.2f} s, rank {rank}"
            assert status == 0 and f"OK span_chaos rank {rank}" in out, (what, out, err[-3000:])
