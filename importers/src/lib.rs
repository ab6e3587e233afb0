//! What a training job already writes, streamed to a hub through a
//! [`Collector`](stepstream_collector::Collector): the binary's `stepstream tail` and
//! `stepstream import`. Apart from the collector so that a training process (and the Python
//! wheel) never carries a log parser or a TensorBoard reader.
//!
//! * `tail` — a metrics CSV, or MindFormers' training log, followed as it grows.
//! * `tensorboard` — TensorBoard event files: TFRecord framing and the `Event` protobuf's
//!   scalars.

pub mod tail;
pub mod tensorboard;
