//! `stepstream watch`: the hub in a terminal, for clusters reached over SSH only. The run
//! list, charts of the chosen runs, their alerts and console, pushed over the page's viewer
//! socket and token (no polling).
//!
//! * `state` — what it knows and shows; takes the hub's messages and the keys.
//! * `draw` — how it looks (ratatui).
//! * `link` — the socket, reopened when it drops.

mod draw;
mod link;
mod state;

use anyhow::{Context, Result};
use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
use state::{App, Key};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

#[derive(clap::Args)]
pub struct WatchArgs {
    /// A run (its id or name: charted first, its project's runs listed) or a project (its runs
    /// listed); every run the token may read when absent.
    target: Option<String>,
    #[command(flatten)]
    from: crate::Reading,
    /// No colours (also when `NO_COLOR` is set): runs differ by their line's marker.
    #[arg(long)]
    mono: bool,
    /// Redraws per second at most (a busy hub's messages are drawn together).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=60))]
    fps: u32,
}

pub fn watch(args: WatchArgs) -> Result<()> {
    let token = args.from.token()?;
    let url = link::viewer_url(&args.from.hub, token.as_deref())?;
    let tls = if url.starts_with("wss://") {
        Some(
            stepstream_collector::tls_client_config(args.from.ca_file.as_deref())
                .map_err(anyhow::Error::msg)?,
        )
    } else {
        None
    };
    let look = draw::Look {
        colour: !args.mono && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let mut terminal = ratatui::try_init().context("the terminal")?;
    let result = rt.block_on(run(
        &mut terminal,
        App::new(args.target),
        look,
        url,
        tls,
        Duration::from_secs(1) / args.fps,
    ));
    ratatui::restore();
    result
}

fn key_of(code: KeyCode, mods: KeyModifiers) -> Option<Key> {
    Some(match code {
        KeyCode::Char('c') if mods.contains(KeyModifiers::CONTROL) => Key::Quit,
        KeyCode::Char('q') | KeyCode::Esc => Key::Quit,
        KeyCode::Up | KeyCode::Char('k') => Key::Up,
        KeyCode::Down | KeyCode::Char('j') => Key::Down,
        KeyCode::Char(' ') => Key::Toggle,
        KeyCode::Enter => Key::Only,
        KeyCode::Char(']') | KeyCode::Char('m') | KeyCode::Tab => Key::NextMetric,
        KeyCode::Char('[') | KeyCode::Char('M') | KeyCode::BackTab => Key::PrevMetric,
        KeyCode::Char('+') | KeyCode::Char('=') => Key::ZoomIn,
        KeyCode::Char('-') | KeyCode::Char('_') => Key::ZoomOut,
        KeyCode::Left | KeyCode::Char('h') => Key::Left,
        KeyCode::Right | KeyCode::Char('l') => Key::Right,
        KeyCode::Char('0') => Key::Reset,
        KeyCode::Char('s') => Key::Smooth,
        KeyCode::Char('c') => Key::Console,
        _ => return None,
    })
}

async fn run(
    terminal: &mut ratatui::DefaultTerminal,
    mut app: App,
    look: draw::Look,
    url: String,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    frame_gap: Duration,
) -> Result<()> {
    // The terminal's events, read on a thread of their own (crossterm's read blocks).
    let (keys_tx, mut keys) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        while let Ok(ev) = crossterm::event::read() {
            if keys_tx.send(ev).is_err() {
                return;
            }
        }
    });
    let (to_app, mut from_link) = mpsc::unbounded_channel();
    let (to_link, from_app) = mpsc::unbounded_channel();
    tokio::spawn(link::run(url, tls, to_app, from_app));
    let send = |out: Vec<stepstream_protocol::FromViewer>| {
        for m in out {
            let _ = to_link.send(m);
        }
    };
    let mut dirty = true;
    let mut drawn = Instant::now() - frame_gap;
    loop {
        if dirty && drawn.elapsed() >= frame_gap {
            terminal.draw(|f| draw::draw(f, &mut app, &look))?;
            drawn = Instant::now();
            dirty = false;
        }
        // Ages tick once a second; otherwise it sleeps until something happens.
        let wait = if dirty {
            frame_gap.saturating_sub(drawn.elapsed())
        } else {
            Duration::from_secs(1)
        };
        tokio::select! {
            ev = keys.recv() => {
                match ev {
                    Some(Event::Key(k)) if k.kind != KeyEventKind::Release => {
                        if let Some(key) = key_of(k.code, k.modifiers) {
                            send(app.on_key(key));
                        }
                    }
                    Some(_) => {}
                    None => return Ok(()),
                }
                dirty = true;
            }
            msg = from_link.recv() => {
                let Some(mut msg) = msg else { return Ok(()) };
                // Everything that is waiting, drawn once.
                loop {
                    match msg {
                        link::FromLink::Up => send(app.on_connect()),
                        link::FromLink::Down(why) => app.link = format!("{why}; retrying"),
                        link::FromLink::Message(m) => send(app.on_message(*m)),
                    }
                    match from_link.try_recv() {
                        Ok(m) => msg = m,
                        Err(_) => break,
                    }
                }
                dirty = true;
            }
            _ = tokio::time::sleep(wait) => dirty = true,
        }
        if app.quit {
            return Ok(());
        }
    }
}
