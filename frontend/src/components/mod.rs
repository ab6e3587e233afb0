//! The page's parts, one module each: the header with its banner, legend and alert list
//! (`header`), the run list (`runs`), the run panel and config comparison (`panel`), and
//! the chart groups with their toolbar (`charts`), the console (`console`), the sample panels (`samples`, histograms drawn by `histograms`), the per-layer heatmaps (`heatmap`).

pub mod charts;
pub mod commands;
pub mod console;
pub mod header;
pub mod heatmap;
pub mod histograms;
pub mod hparams;
pub mod panel;
pub mod rules;
pub mod runs;
pub mod samples;
