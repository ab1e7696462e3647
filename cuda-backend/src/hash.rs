//! A hash of bytes that is the same in every process and Rust version: the disk cache's file
//! names and the shipped archive's keys.

/// FNV-1a, 64-bit: a hash that is the same in every process and Rust version.
pub(crate) fn stable_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
