//! A small PNG writer (8-bit RGB) and base64, so heatmaps need no image crate. The pixel data
//! is deflated with the fixed Huffman code and two kinds of back-reference — the previous pixel
//! and the previous row — which is all a heatmap of flat colour blocks needs.

/// Bytes per RGB pixel.
const BPP: usize = 3;

/// `rgb` (row-major, 3 bytes per pixel) as a PNG file.
pub(crate) fn encode_rgb(width: usize, height: usize, rgb: &[u8]) -> Vec<u8> {
    debug_assert_eq!(rgb.len(), width * height * BPP);
    let stride = width * BPP + 1;
    let mut raw = Vec::with_capacity(stride * height);
    for row in rgb.chunks(width * BPP) {
        raw.push(0); // filter type None: the deflater finds the repeats itself
        raw.extend_from_slice(row);
    }
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut header = Vec::with_capacity(13);
    header.extend_from_slice(&(width as u32).to_be_bytes());
    header.extend_from_slice(&(height as u32).to_be_bytes());
    header.extend_from_slice(&[8, 2, 0, 0, 0]); // 8 bits, RGB, deflate, no filter, no interlace
    chunk(&mut png, b"IHDR", &header);
    chunk(&mut png, b"IDAT", &zlib(&raw, &[BPP, stride]));
    chunk(&mut png, b"IEND", &[]);
    png
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                0xEDB8_8320 ^ (crc >> 1)
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn adler32(bytes: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in bytes.chunks(5552) {
        for &x in chunk {
            a += x as u32;
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    b << 16 | a
}

/// Deflate's length codes 257..=285: base length and extra bits.
#[rustfmt::skip]
const LENGTHS: [(usize, u32); 29] = [
    (3, 0), (4, 0), (5, 0), (6, 0), (7, 0), (8, 0), (9, 0), (10, 0), (11, 1), (13, 1),
    (15, 1), (17, 1), (19, 2), (23, 2), (27, 2), (31, 2), (35, 3), (43, 3), (51, 3), (59, 3),
    (67, 4), (83, 4), (99, 4), (115, 4), (131, 5), (163, 5), (195, 5), (227, 5), (258, 0),
];
/// Deflate's distance codes 0..=29: base distance and extra bits.
#[rustfmt::skip]
const DISTANCES: [(usize, u32); 30] = [
    (1, 0), (2, 0), (3, 0), (4, 0), (5, 1), (7, 1), (9, 2), (13, 2), (17, 3), (25, 3),
    (33, 4), (49, 4), (65, 5), (97, 5), (129, 6), (193, 6), (257, 7), (385, 7), (513, 8),
    (769, 8), (1025, 9), (1537, 9), (2049, 10), (3073, 10), (4097, 11), (6145, 11),
    (8193, 12), (12289, 12), (16385, 13), (24577, 13),
];
const MAX_MATCH: usize = 258;
const MAX_DISTANCE: usize = 32768;

/// Deflate writes bits from the least significant end; Huffman codes go most significant
/// bit first.
struct BitWriter {
    out: Vec<u8>,
    acc: u64,
    bits: u32,
}

impl BitWriter {
    fn bits(&mut self, value: u32, count: u32) {
        self.acc |= (value as u64) << self.bits;
        self.bits += count;
        while self.bits >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.bits -= 8;
        }
    }

    fn code(&mut self, code: u32, len: u32) {
        self.bits(code.reverse_bits() >> (32 - len), len);
    }

    /// A literal byte or end-of-block (256) or length symbol (257..=287), fixed Huffman code.
    fn symbol(&mut self, sym: u32) {
        match sym {
            0..=143 => self.code(0x30 + sym, 8),
            144..=255 => self.code(0x190 + sym - 144, 9),
            256..=279 => self.code(sym - 256, 7),
            _ => self.code(0xC0 + sym - 280, 8),
        }
    }

    fn back_reference(&mut self, len: usize, dist: usize) {
        let i = LENGTHS
            .iter()
            .rposition(|&(base, _)| base <= len)
            .unwrap_or(0);
        let (base, extra) = LENGTHS[i];
        self.symbol(257 + i as u32);
        self.bits((len - base) as u32, extra);
        let j = DISTANCES
            .iter()
            .rposition(|&(base, _)| base <= dist)
            .unwrap_or(0);
        let (base, extra) = DISTANCES[j];
        self.code(j as u32, 5);
        self.bits((dist - base) as u32, extra);
    }

    fn finish(mut self) -> Vec<u8> {
        if self.bits > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

/// A zlib stream of `data` in one fixed-Huffman block, matching only at the given distances.
fn zlib(data: &[u8], distances: &[usize]) -> Vec<u8> {
    let mut w = BitWriter {
        out: vec![0x78, 0x01],
        acc: 0,
        bits: 0,
    };
    w.bits(1, 1); // the final block
    w.bits(1, 2); // fixed Huffman codes
    let mut i = 0;
    while i < data.len() {
        let best = distances
            .iter()
            .filter(|&&d| d <= i && d <= MAX_DISTANCE)
            .map(|&d| {
                let len = (0..MAX_MATCH.min(data.len() - i))
                    .take_while(|&k| data[i + k] == data[i + k - d])
                    .count();
                (len, d)
            })
            .max();
        match best {
            Some((len, dist)) if len >= 3 => {
                w.back_reference(len, dist);
                i += len;
            }
            _ => {
                w.symbol(data[i] as u32);
                i += 1;
            }
        }
    }
    w.symbol(256);
    let mut out = w.finish();
    out.extend_from_slice(&adler32(data).to_be_bytes());
    out
}

/// Standard base64 with padding, as data URLs and Jupyter's `image/png` expect.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let n = group
            .iter()
            .enumerate()
            .fold(0u32, |n, (k, &b)| n | (b as u32) << (16 - 8 * k));
        for k in 0..4 {
            if k <= group.len() {
                out.push(ALPHABET[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes what `zlib` wrote with an independent inflater.
    fn inflate(z: &[u8]) -> Vec<u8> {
        miniz_oxide::inflate::decompress_to_vec_zlib(z).expect("valid zlib stream")
    }

    #[test]
    fn zlib_round_trips_repeats_literals_and_long_runs() {
        let mut data = vec![0u8; 1000];
        data.extend((0..=255u8).cycle().take(3000));
        data.extend(std::iter::repeat_n(7u8, 70_000));
        data.extend([1, 2, 3, 1, 2, 3, 1, 2, 3, 250, 144, 143]);
        let z = zlib(&data, &[3, 256, 997]);
        assert_eq!(inflate(&z), data);
        assert!(z.len() < data.len() / 20, "{} bytes", z.len());
    }

    #[test]
    fn png_has_header_chunks_and_pixels() {
        let rgb: Vec<u8> = (0..4 * 3 * 3).map(|i| (i * 7) as u8).collect();
        let png = encode_rgb(4, 3, &rgb);
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 4);
        let idat_len = u32::from_be_bytes(png[33..37].try_into().unwrap()) as usize;
        assert_eq!(&png[37..41], b"IDAT");
        let raw = inflate(&png[41..41 + idat_len]);
        assert_eq!(raw.len(), 3 * (4 * 3 + 1));
        assert_eq!(&raw[1..13], &rgb[..12]);
        // The CRC of IEND is fixed by the format.
        assert_eq!(&png[png.len() - 4..], &[0xAE, 0x42, 0x60, 0x82]);
    }

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        let cases = [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v")];
        for (plain, encoded) in cases {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
