//! `ChartWidget`: one live chart of one run's metric, to embed in any page.
//!
//! ```html
//! <body data-stepstream-embed>
//!   <canvas id="loss" style="width:600px;height:300px"></canvas>
//!   <script type="module">
//!     import init, { ChartWidget } from "/stepstream_frontend.js";
//!     await init();
//!     new ChartWidget("loss", "ws://127.0.0.1:7070", "RUN_ID", "loss");
//!   </script>
//! </body>
//! ```
//! (`data-stepstream-embed` keeps the full app from mounting.)

use crate::data::RunData;
use crate::ws::{Handlers, Socket};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use stepstream_protocol::{FromViewer, RunId, Subscribe, ToViewer};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

#[wasm_bindgen]
pub struct ChartWidget {
    data: Rc<RefCell<RunData>>,
    _socket: Socket,
}

#[wasm_bindgen]
impl ChartWidget {
    /// Streams `metric` of `run_id` from the hub at `hub` (`ws://host:port`) into the canvas
    /// with id `canvas_id`.
    #[wasm_bindgen(constructor)]
    pub fn new(
        canvas_id: &str,
        hub: &str,
        run_id: &str,
        metric: &str,
    ) -> Result<ChartWidget, JsValue> {
        let canvas: web_sys::HtmlCanvasElement = web_sys::window()
            .and_then(|w| w.document())
            .and_then(|d| d.get_element_by_id(canvas_id))
            .ok_or_else(|| JsValue::from_str(&format!("no element #{canvas_id}")))?
            .dyn_into()
            .map_err(|_| JsValue::from_str(&format!("#{canvas_id} is not a canvas")))?;
        let run = RunId::new(run_id).map_err(|e| JsValue::from_str(&e.to_string()))?;
        let data = Rc::new(RefCell::new(RunData::default()));
        let dirty = Rc::new(Cell::new(true));
        let metric = metric.to_string();

        let (d, m, r) = (data.clone(), metric.clone(), run.clone());
        let on_open = move || {
            let last = d.borrow().last_step();
            vec![FromViewer::Subscribe(Subscribe {
                runs: vec![r.clone()],
                metrics: Some(vec![m.clone()]),
                from_step: last.map(|s| s + 1),
                budget: if last.is_some() { None } else { Some(4000) },
            })]
        };
        let (d, flag, r) = (data.clone(), dirty.clone(), run.clone());
        let on_message = move |msg: ToViewer| {
            let mut d = d.borrow_mut();
            match msg {
                ToViewer::Metrics(x) if x.run_id == r => d.define(&x.metrics),
                ToViewer::Backfill(b) if b.run_id == r => d.backfill(&b),
                ToViewer::Live(l) if l.run_id == r => {
                    d.live(&l, js_sys::Date::now());
                }
                _ => return,
            }
            flag.set(true);
        };
        let socket = Socket::open(
            format!("{}/ws/viewer", hub.trim_end_matches('/')),
            Handlers {
                on_open: Box::new(on_open),
                on_message: Box::new(on_message),
                on_state: Box::new(|_| {}),
            },
        );

        let d = data.clone();
        crate::every_frame(move || {
            if !dirty.replace(false) {
                return;
            }
            let d = d.borrow();
            if let Some(series) = d.series.get(&metric) {
                let markers: Vec<f64> = d.alert_steps().into_iter().map(|s| s as f64).collect();
                let line = crate::chart::Line {
                    label: &metric,
                    color: crate::chart::theme::color_of(run.as_str()),
                    xs: &series.xs,
                    steps: &series.steps,
                    values: &series.values,
                    smoothed: None,
                    markers: &markers,
                };
                let options = crate::chart::Options {
                    title: &metric,
                    window: None,
                    axis: crate::chart::scale::Axis::Step,
                    log: false,
                    robust: false,
                    theme: &crate::chart::theme::LIGHT,
                    legend: false,
                };
                if let Some(drawn) = crate::chart::draw(&canvas, &[line], &options) {
                    let _ = canvas.set_attribute("data-points", &series.received.to_string());
                    let _ = canvas.set_attribute("data-drawn", &drawn.drawn.to_string());
                }
            }
        });
        Ok(ChartWidget {
            data,
            _socket: socket,
        })
    }

    /// Points received so far.
    pub fn points(&self) -> u32 {
        self.data
            .borrow()
            .series
            .values()
            .map(|s| s.received as u32)
            .sum()
    }
}
