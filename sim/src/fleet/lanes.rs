//! The fleet world's picture (`replay --world fleet --svg FILE`): a lane
//! per host, its leases as bars (one row per partition, coloured by
//! partition, the epoch in each bar's title), its states as bands (crashed,
//! paused or frozen at a write, cut off from the store or from the
//! datastore, slow link, not yet joined or left), each write the datastore accepted as a tick, and the store's
//! restarts and the heal across every lane.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// What a traced fleet run draws.
#[derive(Clone, Debug, Default)]
pub struct FleetLanes {
    /// Hosts (lanes).
    pub hosts: usize,
    /// P.
    pub partitions: u32,
    /// Leases held, live on the store's clock: `(host, partition, epoch,
    /// from, to)`.
    pub leases: Vec<(usize, u32, u64, Duration, Duration)>,
    /// Host states: `(host, state, from, to)`.
    pub spans: Vec<(usize, &'static str, Duration, Duration)>,
    /// Writes accepted: `(host, at, partition)`.
    pub writes: Vec<(usize, Duration, u32)>,
    /// Store restarts: `(at, unreachable until)`.
    pub store_restarts: Vec<(Duration, Duration)>,
    /// Instants on one host: `(host, at, what)` (crash, restart, join, leave).
    pub marks: Vec<(usize, Duration, &'static str)>,
    /// When the heal began.
    pub healed_at: Duration,
    /// The run's end.
    pub end: Duration,
}

/// One noted event: `(at, what, a, b, c)` as [`super::book::Book::note`] takes it.
pub type Event = (Duration, &'static str, u64, u64, u64);

/// Pairs of events opening and closing a state of a host.
const STATES: [(&str, &str, &str); 4] = [
    ("crash", "restart", "crashed"),
    ("cut", "mend", "cut off from the store"),
    (
        "cut_datastore",
        "mend_datastore",
        "cut off from the datastore",
    ),
    ("pause", "resume", "paused"),
];

impl FleetLanes {
    /// The picture of `events` (the book's, in order) and the lease spans.
    pub fn build(mut self, events: &[Event], join_at: &[Duration]) -> FleetLanes {
        let mut open: BTreeMap<(usize, &'static str), Duration> = BTreeMap::new();
        for (h, at) in join_at.iter().enumerate() {
            if !at.is_zero() {
                self.spans.push((h, "not joined", Duration::ZERO, *at));
            }
        }
        for &(at, what, a, b, _) in events {
            let h = a as usize;
            if let Some(&(_, _, state)) = STATES.iter().find(|s| s.0 == what) {
                open.entry((h, state)).or_insert(at);
            } else if let Some(&(_, _, state)) = STATES.iter().find(|s| s.1 == what) {
                if let Some(from) = open.remove(&(h, state)) {
                    self.spans.push((h, state, from, at));
                }
            }
            match what {
                "crash" => {
                    self.marks.push((h, at, what));
                    // A freeze ends with its process.
                    for span in self.spans.iter_mut() {
                        if span.0 == h && span.1 == "frozen at a write" && span.3 > at {
                            span.3 = at.max(span.2);
                        }
                    }
                }
                "restart" | "join" => self.marks.push((h, at, what)),
                "leave" => {
                    self.marks.push((h, at, what));
                    open.insert((h, "left"), at);
                }
                "freeze" => {
                    let to = at + Duration::from_millis(b);
                    self.spans.push((h, "frozen at a write", at, to));
                }
                "latency" if b > 1 => drop(open.insert((h, "slow link"), at)),
                "latency" => {
                    if let Some(from) = open.remove(&(h, "slow link")) {
                        self.spans.push((h, "slow link", from, at));
                    }
                }
                "store_restart" => {
                    let to = at + Duration::from_millis(a);
                    self.store_restarts.push((at, to));
                }
                "accept" => self.writes.push((h, at, b as u32)),
                _ => {}
            }
        }
        let end = self.end;
        for ((h, state), from) in open {
            self.spans.push((h, state, from, end));
        }
        self
    }
}

const WIDTH: f64 = 1400.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 60.0;
const ROW: f64 = 6.0;
const GAP: f64 = 14.0;

fn state_colour(state: &str) -> &'static str {
    match state {
        "crashed" => "#ef9a9a",
        "paused" => "#ffe082",
        "frozen at a write" => "#ffb74d",
        "cut off from the store" => "#b0bec5",
        "cut off from the datastore" => "#80cbc4",
        "slow link" => "#e1bee7",
        _ => "#eeeeee",
    }
}

fn partition_colour(p: u32) -> String {
    format!("hsl({}, 65%, 45%)", (p * 137) % 360)
}

/// The SVG document of `f`.
pub fn render(f: &FleetLanes, title: &str) -> String {
    let lane = ROW * f.partitions.max(1) as f64 + GAP;
    let bottom = TOP + lane * f.hosts.max(1) as f64;
    let end = f.end.as_nanos().max(1) as f64;
    let x = |d: Duration| LEFT + (WIDTH - LEFT - RIGHT) * (d.as_nanos() as f64 / end).min(1.0);
    let y = |h: usize| TOP + lane * h as f64;
    let mut o = String::new();
    let height = bottom + 40.0;
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(o, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{} — {} hosts, {} partitions, {} writes accepted, 0 .. {:?}</text>"#,
        title.replace('&', "&amp;").replace('<', "&lt;"),
        f.hosts,
        f.partitions,
        f.writes.len(),
        f.end
    );
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="34">bars: leases held (a row per partition, its colour; epoch in the title) · bands: crashed (red), paused (yellow), frozen at a write (orange), cut off from the store (grey), from the datastore (teal, lower half), slow link (violet), not joined / left (light grey) · ticks: writes accepted · blue: store restart · green: healed</text>"#
    );
    let (hx, ex) = (x(f.healed_at), x(f.end));
    let _ = writeln!(
        o,
        r##"<rect x="{hx:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#e8f5e9"/>"##,
        (ex - hx).max(0.5),
        bottom - TOP
    );
    for &(h, state, from, to) in &f.spans {
        // A cut from the datastore takes the band's lower half, so a host
        // cut from both shows both.
        let band = lane - GAP / 2.0;
        let (top, height) = if state == "cut off from the datastore" {
            (y(h) + band / 2.0, band / 2.0)
        } else {
            (y(h), band)
        };
        let _ = writeln!(
            o,
            r#"<rect x="{:.1}" y="{top:.1}" width="{:.1}" height="{height:.1}" fill="{}"><title>h{h} {state} {from:?} .. {to:?}</title></rect>"#,
            x(from),
            (x(to) - x(from)).max(0.5),
            state_colour(state)
        );
    }
    for h in 0..f.hosts {
        let _ = writeln!(
            o,
            r##"<text x="4" y="{:.1}">host h{h}</text><line x1="{LEFT}" y1="{:.1}" x2="{}" y2="{:.1}" stroke="#bdbdbd"/>"##,
            y(h) + lane / 2.0,
            y(h) + lane - GAP / 2.0,
            WIDTH - RIGHT,
            y(h) + lane - GAP / 2.0
        );
    }
    for &(h, p, epoch, from, to) in &f.leases {
        let _ = writeln!(
            o,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>h{h} holds partition {p} epoch {epoch}: {from:?} .. {to:?}</title></rect>"#,
            x(from),
            y(h) + ROW * f64::from(p),
            (x(to) - x(from)).max(0.5),
            ROW - 1.0,
            partition_colour(p)
        );
    }
    for &(h, at, p) in &f.writes {
        let xa = x(at);
        let yp = y(h) + ROW * f64::from(p);
        let _ = writeln!(
            o,
            r##"<line x1="{xa:.1}" y1="{yp:.1}" x2="{xa:.1}" y2="{:.1}" stroke="#000000" stroke-width="0.5"/>"##,
            yp + ROW - 1.0
        );
    }
    marks(&mut o, f, &x, &y, lane, bottom);
    axis(&mut o, f, &x, bottom);
    o.push_str("</svg>\n");
    o
}

/// Crashes, restarts, joins and leaves on their lane; store restarts
/// across every lane.
fn marks(
    o: &mut String,
    f: &FleetLanes,
    x: &dyn Fn(Duration) -> f64,
    y: &dyn Fn(usize) -> f64,
    lane: f64,
    bottom: f64,
) {
    for &(h, at, what) in &f.marks {
        let c = match what {
            "crash" => "#b71c1c",
            "restart" | "join" => "#2e7d32",
            _ => "#424242",
        };
        let xa = x(at);
        let _ = writeln!(
            o,
            r#"<line x1="{xa:.1}" y1="{:.1}" x2="{xa:.1}" y2="{:.1}" stroke="{c}" stroke-width="2"><title>h{h} {what} at {at:?}</title></line>"#,
            y(h),
            y(h) + lane - GAP / 2.0
        );
    }
    for &(at, to) in &f.store_restarts {
        let _ = writeln!(
            o,
            r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#1565c0" fill-opacity="0.35"><title>store restart at {at:?}, unreachable until {to:?}</title></rect>"##,
            x(at),
            (x(to) - x(at)).max(1.0),
            bottom - TOP
        );
    }
}

fn axis(o: &mut String, f: &FleetLanes, x: &dyn Fn(Duration) -> f64, bottom: f64) {
    let _ = writeln!(
        o,
        r##"<line x1="{LEFT}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#424242"/>"##,
        WIDTH - RIGHT
    );
    for i in 0..=10u32 {
        let at = f.end / 10 * i;
        let tx = x(at);
        let _ = writeln!(
            o,
            r##"<line x1="{tx:.1}" y1="{bottom}" x2="{tx:.1}" y2="{}" stroke="#424242"/><text x="{tx:.1}" y="{}" text-anchor="middle">{:.1}s</text>"##,
            bottom + 5.0,
            bottom + 18.0,
            at.as_secs_f64()
        );
    }
}
