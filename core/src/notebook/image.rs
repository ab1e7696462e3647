//! Heatmap images as PNG (the `png` crate) and their base64 form for data URLs and Jupyter's
//! `image/png` (the `base64` crate).

use base64::Engine;

/// `rgb` (row-major, 3 bytes per pixel) as a PNG file.
pub(crate) fn encode_rgb(width: usize, height: usize, rgb: &[u8]) -> crate::error::Result<Vec<u8>> {
    let failed = |e: png::EncodingError| crate::error::Error::Backend(format!("PNG encoding: {e}"));
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width as u32, height as u32);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(failed)?;
    writer.write_image_data(rgb).map_err(failed)?;
    writer.finish().map_err(failed)?;
    Ok(out)
}

/// Standard base64 with padding.
pub(crate) fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_decodes_to_the_pixels() {
        let rgb: Vec<u8> = (0..4 * 3 * 3).map(|i| (i * 7) as u8).collect();
        let file = encode_rgb(4, 3, &rgb).unwrap();
        let decoder = png::Decoder::new(std::io::Cursor::new(file));
        let mut reader = decoder.read_info().unwrap();
        let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut pixels).unwrap();
        assert_eq!((info.width, info.height), (4, 3));
        assert_eq!(&pixels[..info.buffer_size()], &rgb[..]);
    }

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
