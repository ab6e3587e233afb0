//! Images logged as raw pixels, encoded on the sender thread (never the training thread's
//! time): PNG (lossless) or JPEG. A raw image is checked before it is queued: its size, its
//! channels (1 gray, 2 gray + alpha, 3 RGB, 4 RGBA), its pixel count.

use stepstream_protocol::{Image, ImageFormat};

/// Pixels of one image, at most (a 4096 x 4096 picture).
pub const MAX_PIXELS: u64 = 4096 * 4096;

/// An image as the training code has it: 8-bit channels, row by row, channels interleaved.
#[derive(Clone, Debug, PartialEq)]
pub struct RawImage {
    pub width: u32,
    pub height: u32,
    pub channels: u8,
    pub pixels: Vec<u8>,
    pub format: ImageFormat,
    /// JPEG's quality, 1 to 100.
    pub quality: u8,
    pub caption: String,
}

impl RawImage {
    /// What is wrong with the raw image, if anything.
    pub fn check(&self) -> Result<(), String> {
        if self.width == 0 || self.height == 0 {
            return Err(format!(
                "an image of {}x{} pixels is empty",
                self.width, self.height
            ));
        }
        let pixels = u64::from(self.width) * u64::from(self.height);
        if pixels > MAX_PIXELS {
            return Err(format!(
                "an image of {}x{} pixels is larger than {MAX_PIXELS} pixels",
                self.width, self.height
            ));
        }
        if !(1..=4).contains(&self.channels) {
            return Err(format!(
                "an image has 1 to 4 channels (gray, gray + alpha, RGB, RGBA), not {}",
                self.channels
            ));
        }
        let want = pixels * u64::from(self.channels);
        if self.pixels.len() as u64 != want {
            return Err(format!(
                "an image of {}x{}x{} needs {want} bytes, not {}",
                self.width,
                self.height,
                self.channels,
                self.pixels.len()
            ));
        }
        Ok(())
    }

    /// The image encoded.
    pub fn encode(&self) -> Result<Image, String> {
        self.check()?;
        let data = match self.format {
            ImageFormat::Png => self.png()?,
            ImageFormat::Jpeg => self.jpeg()?,
        };
        Ok(Image {
            format: self.format,
            width: self.width,
            height: self.height,
            caption: self.caption.clone(),
            data,
        })
    }

    fn png(&self) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let mut encoder = png::Encoder::new(&mut out, self.width, self.height);
        encoder.set_color(match self.channels {
            1 => png::ColorType::Grayscale,
            2 => png::ColorType::GrayscaleAlpha,
            3 => png::ColorType::Rgb,
            _ => png::ColorType::Rgba,
        });
        encoder.set_depth(png::BitDepth::Eight);
        encoder.set_compression(png::Compression::Fast);
        let mut writer = encoder.write_header().map_err(|e| e.to_string())?;
        writer
            .write_image_data(&self.pixels)
            .map_err(|e| e.to_string())?;
        writer.finish().map_err(|e| e.to_string())?;
        Ok(out)
    }

    fn jpeg(&self) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let encoder = jpeg_encoder::Encoder::new(&mut out, self.quality.clamp(1, 100));
        let (color, pixels) = match self.channels {
            1 => (
                jpeg_encoder::ColorType::Luma,
                std::borrow::Cow::Borrowed(&self.pixels[..]),
            ),
            3 => (
                jpeg_encoder::ColorType::Rgb,
                std::borrow::Cow::Borrowed(&self.pixels[..]),
            ),
            4 => (
                jpeg_encoder::ColorType::Rgba,
                std::borrow::Cow::Borrowed(&self.pixels[..]),
            ),
            // Gray + alpha: JPEG has no alpha; the gray is kept.
            _ => (
                jpeg_encoder::ColorType::Luma,
                std::borrow::Cow::Owned(self.pixels.chunks(2).map(|p| p[0]).collect()),
            ),
        };
        let (w, h) = (
            u16::try_from(self.width).map_err(|_| "a JPEG is at most 65535 wide")?,
            u16::try_from(self.height).map_err(|_| "a JPEG is at most 65535 high")?,
        );
        encoder
            .encode(&pixels, w, h, color)
            .map_err(|e| e.to_string())?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(w: u32, h: u32, c: u8, format: ImageFormat) -> RawImage {
        RawImage {
            width: w,
            height: h,
            channels: c,
            pixels: (0..w * h * u32::from(c)).map(|i| (i % 251) as u8).collect(),
            format,
            quality: 90,
            caption: "x".into(),
        }
    }

    #[test]
    fn png_round_trips_and_jpeg_encodes() {
        let r = raw(7, 5, 3, ImageFormat::Png);
        let img = r.encode().unwrap();
        let decoder = png::Decoder::new(std::io::Cursor::new(img.data));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (7, 5));
        assert_eq!(&buf[..info.buffer_size()], &r.pixels[..]);
        let jpeg = raw(16, 8, 2, ImageFormat::Jpeg).encode().unwrap();
        assert_eq!(&jpeg.data[..2], &[0xff, 0xd8]);
    }

    #[test]
    fn bad_shapes_are_named() {
        assert!(raw(4, 4, 5, ImageFormat::Png)
            .check()
            .unwrap_err()
            .contains("channels"));
        let mut short = raw(4, 4, 3, ImageFormat::Png);
        short.pixels.pop();
        assert!(short.check().unwrap_err().contains("needs 48 bytes"));
        assert!(raw(0, 4, 3, ImageFormat::Png).check().is_err());
        assert!(raw(5000, 5000, 1, ImageFormat::Png)
            .check()
            .unwrap_err()
            .contains("larger"));
    }
}
