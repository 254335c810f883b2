//! Draws a traced run as an SVG timeline, by hand: a lane per tenant, each
//! attempt a bar coloured by its end, backoff waits as dashed lines,
//! waiting backlogs (linger) as pale bands, stage calls as ticks, losses as
//! crosses, flushes, settles, shutdowns and abandon as vertical marks, storms
//! and the healed phase as background.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use outbox::core::Time;

use crate::timeline::{AttemptEnd, ControlKind, HostMark, Timeline};

const WIDTH: f64 = 1400.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 70.0;
const LANE: f64 = 20.0;
/// Lanes drawn at most (the busiest tenants).
pub const MAX_LANES: usize = 48;

fn colour(end: AttemptEnd) -> (&'static str, &'static str) {
    match end {
        AttemptEnd::Running => ("#90caf9", "still running"),
        AttemptEnd::Written => ("#2e7d32", "written"),
        AttemptEnd::Failed => ("#c62828", "failed (error)"),
        AttemptEnd::Panicked => ("#8e24aa", "panicked"),
        AttemptEnd::TimedOut => ("#ef6c00", "timed out"),
        AttemptEnd::Rejected => ("#212121", "rejected"),
        AttemptEnd::Cancelled => ("#9e9e9e", "cancelled"),
        AttemptEnd::TaskLost => ("#6d4c41", "task lost"),
    }
}

fn control_style(kind: ControlKind) -> (&'static str, &'static str) {
    match kind {
        ControlKind::Flush => ("#1565c0", "4 3"),
        ControlKind::Settle => ("#00897b", "2 3"),
        ControlKind::Shutdown => ("#d50000", "none"),
        ControlKind::Abandon => ("#000000", "none"),
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The SVG document for `t`, drawn back to front.
pub fn render(t: &Timeline, title: &str) -> String {
    if let Some(fleet) = &t.fleet {
        return crate::fleet::lanes::render(fleet, title);
    }
    let (tenants, hidden) = busiest_tenants(t);
    let mut c = Canvas::new(t, &tenants);
    c.header(t, title, hidden);
    c.legend();
    c.backgrounds(t);
    c.lanes(&tenants);
    c.waiting_bands(t);
    c.stage_ticks(t);
    c.backoffs(t);
    c.attempts(t);
    c.losses(t);
    c.controls(t);
    c.host_marks(t);
    c.time_axis();
    c.o.push_str("</svg>\n");
    c.o
}

/// The tenants that get a lane (the busiest [`MAX_LANES`], in tenant
/// order), and how many quieter ones are not drawn.
fn busiest_tenants(t: &Timeline) -> (Vec<u8>, usize) {
    let mut activity: BTreeMap<u8, usize> = BTreeMap::new();
    for a in &t.attempts {
        *activity.entry(a.tenant).or_default() += 2;
    }
    for s in &t.stages {
        *activity.entry(s.1).or_default() += 1;
    }
    for l in &t.losses {
        *activity.entry(l.tenant).or_default() += 1;
    }
    let mut busiest: Vec<(u8, usize)> = activity.into_iter().collect();
    busiest.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let hidden = busiest.len().saturating_sub(MAX_LANES);
    busiest.truncate(MAX_LANES);
    let mut tenants: Vec<u8> = busiest.into_iter().map(|(k, _)| k).collect();
    tenants.sort_unstable();
    (tenants, hidden)
}

/// The document being drawn, with its scales: time to x, tenant to lane.
struct Canvas {
    /// The SVG text so far.
    o: String,
    /// Each drawn tenant's lane index.
    lane: BTreeMap<u8, usize>,
    /// The run's end in ns (at least 1): the right edge.
    end: f64,
    /// The bottom of the last lane.
    bottom: f64,
}

impl Canvas {
    fn new(t: &Timeline, tenants: &[u8]) -> Canvas {
        Canvas {
            o: String::new(),
            lane: tenants.iter().enumerate().map(|(i, k)| (*k, i)).collect(),
            end: t.end.as_nanos().max(1) as f64,
            bottom: TOP + LANE * tenants.len().max(1) as f64,
        }
    }

    fn x(&self, at: Time) -> f64 {
        let plot = WIDTH - LEFT - RIGHT;
        LEFT + plot * (at.as_nanos() as f64 / self.end).min(1.0)
    }

    /// The top of tenant `k`'s lane, if it has one.
    fn y(&self, k: u8) -> Option<f64> {
        self.lane.get(&k).map(|i| TOP + LANE * *i as f64)
    }

    fn header(&mut self, t: &Timeline, title: &str, hidden: usize) {
        let o = &mut self.o;
        let height = self.bottom + 60.0;
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="11">"#
        );
        let _ = writeln!(o, "<title>{}</title>", esc(title));
        let _ = writeln!(o, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
        let _ = writeln!(
            o,
            r#"<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{} — {} attempts, virtual time 0 .. {}{}</text>"#,
            esc(title),
            t.attempts.len(),
            t.end,
            if hidden > 0 {
                format!(" ({hidden} quieter tenants not drawn)")
            } else {
                String::new()
            }
        );
    }

    fn legend(&mut self) {
        let o = &mut self.o;
        let legend = [
            AttemptEnd::Written,
            AttemptEnd::Failed,
            AttemptEnd::Panicked,
            AttemptEnd::TimedOut,
            AttemptEnd::Rejected,
            AttemptEnd::Cancelled,
            AttemptEnd::TaskLost,
            AttemptEnd::Running,
        ];
        let mut lx = LEFT;
        for e in legend {
            let (c, name) = colour(e);
            let _ = writeln!(
                o,
                r#"<rect x="{lx}" y="26" width="12" height="9" fill="{c}"/><text x="{}" y="34">{name}</text>"#,
                lx + 15.0
            );
            lx += 15.0 + 7.0 * name.len() as f64 + 14.0;
        }
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" y1="48" x2="{}" y2="48" stroke="#f9a825" stroke-width="2" stroke-dasharray="3 2"/><text x="{}" y="52">backoff</text>"##,
            LEFT + 24.0,
            LEFT + 28.0
        );
        let _ = writeln!(
            o,
            r##"<rect x="{}" y="43" width="24" height="9" fill="#bbdefb"/><text x="{}" y="52">waiting / linger</text>"##,
            LEFT + 95.0,
            LEFT + 123.0
        );
        let _ = writeln!(
            o,
            r##"<text x="{}" y="52" fill="#d50000">x lost</text><text x="{}" y="52" fill="#ff6f00">x dropped</text><text x="{}" y="52">| flush (blue) settle (teal) shutdown (red) abandon (black); stage ticks grey, purple if not accepted; pink: storm; green: healed</text>"##,
            LEFT + 250.0,
            LEFT + 310.0,
            LEFT + 390.0
        );
    }

    /// Storms and the healed phase.
    fn backgrounds(&mut self, t: &Timeline) {
        let bottom = self.bottom;
        for (from, to) in &t.storms {
            let (xf, xt) = (self.x(*from), self.x(*to));
            let _ = writeln!(
                self.o,
                r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#fce4ec"/>"##,
                xf,
                (xt - xf).max(0.5),
                bottom - TOP
            );
        }
        if let Some(h) = t.healed_at {
            let (xh, xe) = (self.x(h), self.x(t.end));
            let _ = writeln!(
                self.o,
                r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#e8f5e9"/>"##,
                xh,
                (xe - xh).max(0.5),
                bottom - TOP
            );
        }
    }

    fn lanes(&mut self, tenants: &[u8]) {
        for (i, k) in tenants.iter().enumerate() {
            let ly = TOP + LANE * i as f64;
            let _ = writeln!(
                self.o,
                r##"<line x1="{LEFT}" y1="{ly}" x2="{}" y2="{ly}" stroke="#eeeeee"/><text x="4" y="{}">tenant {k}</text>"##,
                WIDTH - RIGHT,
                ly + 13.0
            );
        }
    }

    /// Waiting bands: from the first stage after a tenant's previous first
    /// attempt to its next first attempt.
    fn waiting_bands(&mut self, t: &Timeline) {
        let mut first_wait: BTreeMap<u8, Time> = BTreeMap::new();
        let mut bands = Vec::new();
        let mut stages = t.stages.iter().peekable();
        for a in t.attempts.iter().filter(|a| a.attempt == 1) {
            while let Some(s) = stages.next_if(|s| s.0 <= a.start) {
                if s.2 > 0 {
                    first_wait.entry(s.1).or_insert(s.0);
                }
            }
            if let Some(from) = first_wait.remove(&a.tenant) {
                if a.start > from {
                    bands.push((a.tenant, from, a.start));
                }
            }
        }
        for (k, from, to) in bands {
            if let Some(ly) = self.y(k) {
                let (xf, xt) = (self.x(from), self.x(to));
                let _ = writeln!(
                    self.o,
                    r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="8" fill="#bbdefb"><title>tenant {k} waiting {from} .. {to}</title></rect>"##,
                    xf,
                    ly + 6.0,
                    (xt - xf).max(0.5)
                );
            }
        }
    }

    fn stage_ticks(&mut self, t: &Timeline) {
        for (at, k, accepted, refused) in &t.stages {
            if let Some(ly) = self.y(*k) {
                // Not the drop colour: a stage refused after the fence is lost.
                let c = if *refused > 0 { "#6a1b9a" } else { "#757575" };
                let xa = self.x(*at);
                let _ = writeln!(
                    self.o,
                    r#"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="{c}" stroke-width="0.6"><title>{at} stage {accepted} accepted, {refused} refused</title></line>"#,
                    xa,
                    ly + 1.0,
                    ly + 5.0
                );
            }
        }
    }

    fn backoffs(&mut self, t: &Timeline) {
        for (k, from, to) in &t.backoffs {
            if let Some(ly) = self.y(*k) {
                let (xf, xt) = (self.x(*from), self.x(*to));
                let _ = writeln!(
                    self.o,
                    r##"<line x1="{:.1}" y1="{2:.1}" x2="{:.1}" y2="{2:.1}" stroke="#f9a825" stroke-width="2" stroke-dasharray="3 2"><title>tenant {k} backoff {from} .. {to}</title></line>"##,
                    xf,
                    xt,
                    ly + 10.0
                );
            }
        }
    }

    fn attempts(&mut self, t: &Timeline) {
        for a in &t.attempts {
            if let Some(ly) = self.y(a.tenant) {
                let (c, name) = colour(a.result);
                let end = if a.result == AttemptEnd::Running {
                    t.end
                } else {
                    a.end
                };
                let (xs, xe) = (self.x(a.start), self.x(end));
                let _ = writeln!(
                    self.o,
                    r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="10" fill="{c}"><title>w{} attempt {} of tenant {}: {} items, {} .. {}, {name}</title></rect>"#,
                    xs,
                    ly + 5.0,
                    (xe - xs).max(1.0),
                    a.write,
                    a.attempt,
                    a.tenant,
                    a.items,
                    a.start,
                    end
                );
            }
        }
    }

    /// Losses and drops, as crosses under their tenant's lane.
    fn losses(&mut self, t: &Timeline) {
        for l in &t.losses {
            if let Some(ly) = self.y(l.tenant) {
                let c = if l.dropped { "#ff6f00" } else { "#d50000" };
                let what = if l.dropped { "dropped" } else { "lost" };
                let xa = self.x(l.at);
                let _ = writeln!(
                    self.o,
                    r#"<text x="{:.1}" y="{:.1}" fill="{c}" font-size="10" text-anchor="middle">x<title>{} {what} {} of tenant {}: {}</title></text>"#,
                    xa,
                    ly + 18.0,
                    l.at,
                    l.items,
                    l.tenant,
                    l.reason
                );
            }
        }
    }

    /// Flushes, settles, shutdowns and abandons, with their deadlines.
    fn controls(&mut self, t: &Timeline) {
        let bottom = self.bottom;
        for (at, kind, deadline) in &t.controls {
            let (c, dash) = control_style(*kind);
            let xa = self.x(*at);
            let _ = writeln!(
                self.o,
                r#"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{2:.1}" stroke="{c}" stroke-width="1.2" stroke-dasharray="{dash}"><title>{at} {3}{4}</title></line>"#,
                xa,
                TOP - 6.0,
                bottom,
                kind.as_str(),
                deadline.map_or(String::new(), |d| format!(" deadline {d}"))
            );
            if let Some(d) = deadline {
                let dx = self.x(*d);
                let _ = writeln!(
                    self.o,
                    r#"<path d="M{:.1} {} l4 -6 l-8 0 z" fill="{c}"><title>{} deadline {d}</title></path>"#,
                    dx,
                    TOP - 1.0,
                    kind.as_str()
                );
            }
        }
    }

    /// The application host's crashes (thick red), restarts (green),
    /// recoveries (blue) and sync answers (small ticks above the lanes:
    /// grey if durable, orange if not); crash world.
    fn host_marks(&mut self, t: &Timeline) {
        let bottom = self.bottom;
        for (at, mark) in &t.host {
            let x = self.x(*at);
            let (c, width, top) = match mark {
                HostMark::Crash => ("#b71c1c", 3.0, TOP - 10.0),
                HostMark::Restart => ("#2e7d32", 2.0, TOP - 10.0),
                HostMark::Recovery(_) => ("#1565c0", 1.5, TOP - 10.0),
                HostMark::Sync(true) => ("#9e9e9e", 1.0, TOP - 8.0),
                HostMark::Sync(false) => ("#ef6c00", 1.0, TOP - 8.0),
            };
            let y2 = if matches!(mark, HostMark::Sync(_)) {
                TOP - 2.0
            } else {
                bottom
            };
            let label = match mark {
                HostMark::Recovery(n) => format!("recovery: {n} items"),
                m => m.as_str().to_owned(),
            };
            let _ = writeln!(
                self.o,
                r#"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{y2:.1}" stroke="{c}" stroke-width="{width}"><title>{at} {label}</title></line>"#
            );
        }
    }

    fn time_axis(&mut self) {
        let bottom = self.bottom;
        let _ = writeln!(
            self.o,
            r##"<line x1="{LEFT}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#424242"/>"##,
            WIDTH - RIGHT
        );
        for i in 0..=10u64 {
            let at = Time::from_nanos((self.end as u64) / 10 * i);
            let tx = self.x(at);
            let _ = writeln!(
                self.o,
                r##"<line x1="{tx:.1}" y1="{bottom}" x2="{tx:.1}" y2="{}" stroke="#424242"/><text x="{tx:.1}" y="{}" text-anchor="middle">{at}</text>"##,
                bottom + 5.0,
                bottom + 18.0
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Attempt;

    #[test]
    fn renders_a_small_timeline() {
        let t = Timeline {
            tenants: 2,
            attempts: vec![Attempt {
                tenant: 1,
                write: 1,
                attempt: 1,
                items: 3,
                start: Time::from_millis(1),
                end: Time::from_millis(5),
                result: AttemptEnd::Failed,
            }],
            backoffs: vec![(1, Time::from_millis(5), Time::from_millis(9))],
            stages: vec![(Time::ZERO, 1, 3, 0)],
            controls: vec![(
                Time::from_millis(7),
                ControlKind::Flush,
                Some(Time::from_millis(8)),
            )],
            end: Time::from_millis(10),
            ..Timeline::default()
        };
        let svg = render(&t, "a <test>");
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a &lt;test&gt;"));
        assert!(svg.contains("tenant 1"));
    }
}
