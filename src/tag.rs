//! A collective's tag: the stream it belongs to (high bits) and its sequence number in that
//! stream (low [`SEQ_BITS`]). Stream 0 is the world's, each group has its own, and the largest
//! ([`SETUP_STREAM`]) makes groups and shrinks. The session numbers its collectives with it, the
//! demultiplexer matches on it, and errors print it.

/// The bits of a collective's tag below its stream: the stream's sequence number.
pub const SEQ_BITS: u32 = 40;

/// The stream that making groups and shrinking use: the largest.
pub(crate) const SETUP_STREAM: u32 = (1 << (64 - SEQ_BITS)) - 1;

/// A stream's sequence numbers.
pub(crate) const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// The stream a collective's tag belongs to: 0 for the world's collectives, a group's own, or
/// the one that makes groups.
#[must_use]
pub const fn stream_of(tag: u64) -> u32 {
    (tag >> SEQ_BITS) as u32
}

/// A collective's tag as people read it: "#3" for the world's third collective, "#3 of group
/// stream 2" for a group's.
pub(crate) fn seq_text(tag: u64) -> String {
    let seq = tag & SEQ_MASK;
    match stream_of(tag) {
        0 => format!("#{seq}"),
        SETUP_STREAM => format!("#{seq} of making groups"),
        stream => format!("#{seq} of group stream {stream}"),
    }
}

#[cfg(test)]
mod tests {
    use super::{SEQ_BITS, SETUP_STREAM, seq_text};

    #[test]
    fn tags_read_as_people_say_them() {
        assert_eq!(seq_text(3), "#3");
        assert_eq!(seq_text((2 << SEQ_BITS) | 3), "#3 of group stream 2");
        assert_eq!(
            seq_text((u64::from(SETUP_STREAM) << SEQ_BITS) | 1),
            "#1 of making groups"
        );
    }
}
