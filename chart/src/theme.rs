//! Colours: the light and dark chart themes, and each run's stable colour (the same in the
//! run list, the legend and every chart, whatever else is selected).

use plotters::style::RGBColor;

/// What a chart is drawn with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Theme {
    pub dark: bool,
    pub background: RGBColor,
    pub text: RGBColor,
    pub grid: RGBColor,
    pub axis: RGBColor,
    pub alert: RGBColor,
    /// A command the training acted on (a note, a checkpoint, a stop).
    pub note: RGBColor,
    pub crosshair: &'static str,
    pub selection: &'static str,
}

pub const LIGHT: Theme = Theme {
    dark: false,
    background: RGBColor(255, 255, 255),
    text: RGBColor(29, 35, 48),
    grid: RGBColor(236, 237, 240),
    axis: RGBColor(120, 125, 135),
    alert: RGBColor(220, 38, 38),
    note: RGBColor(37, 99, 235),
    crosshair: "rgba(30,30,40,0.55)",
    selection: "rgba(37,99,235,0.15)",
};

pub const DARK: Theme = Theme {
    dark: true,
    background: RGBColor(24, 26, 32),
    text: RGBColor(220, 223, 230),
    grid: RGBColor(45, 48, 58),
    axis: RGBColor(140, 145, 155),
    alert: RGBColor(248, 81, 73),
    note: RGBColor(96, 165, 250),
    crosshair: "rgba(230,230,240,0.6)",
    selection: "rgba(96,165,250,0.2)",
};

/// Distinct on light and dark backgrounds (Tableau 10 without its grey, which reads as
/// "not selected", and three additions).
pub const PALETTE: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(230, 171, 2),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 90, 160),
    RGBColor(200, 80, 0),
];

/// A stable colour for a key (a run id, or a run id and a device): FNV-1a of its bytes.
pub fn color_of(key: &str) -> RGBColor {
    let mut h: u32 = 0x811c_9dc5;
    for b in key.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    PALETTE[(h % PALETTE.len() as u32) as usize]
}

pub fn css(c: RGBColor) -> String {
    let RGBColor(r, g, b) = c;
    format!("rgb({r},{g},{b})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_always_gets_the_same_colour() {
        assert_eq!(color_of("run-a"), color_of("run-a"));
        let distinct: std::collections::HashSet<_> = (0..50)
            .map(|i| css(color_of(&format!("run-{i}"))))
            .collect();
        assert!(distinct.len() >= 8, "{distinct:?}");
    }
}
