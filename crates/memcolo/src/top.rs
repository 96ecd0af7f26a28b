//! `memcolo top`: a refreshing terminal view of the agent (ratatui): a usage gauge
//! against the M3 thresholds, then the status table. `q` or Esc quits.

use crate::status::{fetch, render};
use anyhow::Result;
use crossterm::event::{self, Event, KeyCode};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Style};
use ratatui::widgets::{Block, Borders, Gauge, Paragraph};
use std::path::Path;
use std::time::Duration;

pub fn top(socket: &Path, interval_ms: u64) -> Result<()> {
    // Fail before taking over the terminal when no agent answers.
    fetch(socket)?;
    let mut term = ratatui::init();
    let res = (|| -> Result<()> {
        loop {
            let (lines, ratio, zone) = match fetch(socket) {
                Ok(s) => {
                    let used = s["memory"]["working_set_bytes"].as_u64().unwrap_or(0) as f64;
                    let top = s["thresholds"]["top_bytes"].as_u64().unwrap_or(1).max(1) as f64;
                    (
                        render(&s),
                        (used / top).min(1.0),
                        s["zone"].as_str().unwrap_or("?").to_string(),
                    )
                }
                Err(e) => (vec![format!("agent unreachable: {e:#}")], 0.0, "?".into()),
            };
            let color = match zone.as_str() {
                "green" => Color::Green,
                "yellow" => Color::Yellow,
                _ => Color::Red,
            };
            term.draw(|f| {
                let [g, body] =
                    Layout::vertical([Constraint::Length(3), Constraint::Min(0)]).areas(f.area());
                f.render_widget(
                    Gauge::default()
                        .block(
                            Block::default()
                                .borders(Borders::ALL)
                                .title(" working set / top of memory "),
                        )
                        .gauge_style(Style::default().fg(color))
                        .ratio(ratio),
                    g,
                );
                f.render_widget(
                    Paragraph::new(lines.join("\n")).block(
                        Block::default()
                            .borders(Borders::ALL)
                            .title(" memcolo (q quits) "),
                    ),
                    body,
                );
            })?;
            if event::poll(Duration::from_millis(interval_ms))? {
                if let Event::Key(k) = event::read()? {
                    if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) {
                        return Ok(());
                    }
                }
            }
        }
    })();
    ratatui::restore();
    res
}
