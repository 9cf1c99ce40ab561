//! Charts as inline SVG, drawn here (no charting library): grouped bars and lines, one
//! colour per run. Every label goes through [`super::render::escape`].

use super::render::escape;

const W: f64 = 560.0;
const H: f64 = 240.0;
const LEFT: f64 = 48.0;
const BOTTOM: f64 = 40.0;
const TOP: f64 = 16.0;
const RIGHT: f64 = 12.0;

pub const PALETTE: [&str; 8] = ["#3566c8", "#e0782f", "#3a9a5b", "#b8423a", "#7d55b5", "#8a6a48", "#c45fa0", "#6b7280"];

pub fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

fn frame(title: &str, y_max: f64, y_label: &str, body: &str, x_axis: &str) -> String {
    let mut s = format!(
        r#"<figure class="chart"><figcaption>{}</figcaption><svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{}">"#,
        escape(title),
        escape(title)
    );
    let plot_h = H - TOP - BOTTOM;
    for i in 0..=4 {
        let v = y_max * i as f64 / 4.0;
        let y = TOP + plot_h * (1.0 - i as f64 / 4.0);
        s.push_str(&format!(r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/>"##, W - RIGHT));
        s.push_str(&format!(r##"<text x="{}" y="{:.1}" font-size="10" text-anchor="end" fill="#555">{}</text>"##, LEFT - 4.0, y + 3.0, short(v)));
    }
    s.push_str(&format!(r##"<text x="12" y="{:.1}" font-size="10" fill="#555" transform="rotate(-90 12 {:.1})" text-anchor="middle">{}</text>"##, TOP + plot_h / 2.0, TOP + plot_h / 2.0, escape(y_label)));
    s.push_str(body);
    s.push_str(x_axis);
    s.push_str("</svg></figure>");
    s
}

fn short(v: f64) -> String {
    if v >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Bars: `series[run][category]`, grouped by category.
pub fn bars(title: &str, categories: &[String], series: &[Vec<f64>], y_label: &str) -> String {
    let y_max = series.iter().flatten().cloned().fold(0.0, f64::max).max(1e-9);
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let group = plot_w / categories.len().max(1) as f64;
    let bar = (group * 0.8) / series.len().max(1) as f64;
    let mut body = String::new();
    for (r, values) in series.iter().enumerate() {
        for (c, v) in values.iter().enumerate() {
            let h = plot_h * v / y_max;
            let x = LEFT + group * c as f64 + group * 0.1 + bar * r as f64;
            body.push_str(&format!(
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                TOP + plot_h - h,
                (bar - 1.0).max(1.0),
                colour(r),
                escape(&categories[c]),
                short(*v)
            ));
        }
    }
    let mut axis = String::new();
    for (c, label) in categories.iter().enumerate() {
        let x = LEFT + group * (c as f64 + 0.5);
        axis.push_str(&format!(r##"<text x="{x:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#333">{}</text>"##, H - BOTTOM + 14.0, escape(label)));
    }
    frame(title, y_max, y_label, &body, &axis)
}

/// Lines: `series[run]` of (x, y) points.
pub fn lines(title: &str, series: &[Vec<(f64, f64)>], x_label: &str, y_label: &str, y_max: Option<f64>) -> String {
    let points = series.iter().flatten();
    let x_min = points.clone().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x_max = points.clone().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let y_top = y_max.unwrap_or_else(|| points.clone().map(|p| p.1).fold(0.0, f64::max)).max(1e-9);
    let (x_min, x_max) = if x_min.is_finite() && x_max > x_min { (x_min, x_max) } else { (0.0, 1.0) };
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let at = |(x, y): (f64, f64)| (LEFT + plot_w * (x - x_min) / (x_max - x_min), TOP + plot_h * (1.0 - y / y_top));
    let mut body = String::new();
    for (r, pts) in series.iter().enumerate() {
        let path: Vec<String> = pts.iter().map(|p| at(*p)).map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        body.push_str(&format!(r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#, colour(r), path.join(" ")));
        for p in pts {
            let (x, y) = at(*p);
            body.push_str(&format!(r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5" fill="{}"><title>{} {}</title></circle>"#, colour(r), short(p.0), short(p.1)));
        }
    }
    let mut axis = String::new();
    // Whole numbers (k) get a tick each when there are few; anything else five ticks.
    let whole = series.iter().flatten().all(|p| p.0.fract() == 0.0) && x_max - x_min <= 12.0;
    let ticks: Vec<f64> = if whole { (x_min as i64..=x_max as i64).map(|v| v as f64).collect() } else { (0..=4).map(|i| x_min + (x_max - x_min) * i as f64 / 4.0).collect() };
    for v in ticks {
        let x = LEFT + plot_w * (v - x_min) / (x_max - x_min);
        axis.push_str(&format!(r##"<text x="{x:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#333">{}</text>"##, H - BOTTOM + 14.0, short(v)));
    }
    axis.push_str(&format!(r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#555">{}</text>"##, LEFT + plot_w / 2.0, H - 6.0, escape(x_label)));
    frame(title, y_top, y_label, &body, &axis)
}
