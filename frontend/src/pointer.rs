//! The pointer's state on the charts: the zoom box or pan being dragged. The mouse handlers
//! (`interact`) set it; the frame loop (`frame`) draws the box from it.

use std::cell::RefCell;

#[derive(Clone, Copy)]
pub enum Drag {
    /// Zoom box from `start` to `now` (CSS pixels in the chart).
    Box { start: f64, now: f64 },
    /// Pan: the pointer's pixel and the window when it was pressed.
    Pan { start: f64, window: (f64, f64) },
}

thread_local! {
    pub static DRAG: RefCell<Option<(String, Drag)>> = const { RefCell::new(None) };
}

/// The zoom box being dragged on a chart, in CSS pixels.
pub fn selection(chart: &str) -> Option<(f64, f64)> {
    DRAG.with(|d| match d.borrow().as_ref() {
        Some((c, Drag::Box { start, now })) if c == chart => Some((*start, *now)),
        _ => None,
    })
}
