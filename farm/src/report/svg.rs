//! Charts as inline SVG, drawn here (no charting library): grouped bars and lines, one
//! colour per run, with the run's label in each bar's and point's tooltip. The SVG is
//! written with `maud` like the rest of the report, so labels are escaped as any text.
//! Every shape is closed by an end tag (`<line ...></line>`): inside `<svg>` the HTML parser
//! keeps an element without one open and nests what follows into it.

use maud::{html, Markup};

use super::page::Text;

const W: f64 = 560.0;
const H: f64 = 240.0;
const LEFT: f64 = 48.0;
const BOTTOM: f64 = 40.0;
const TOP: f64 = 16.0;
const RIGHT: f64 = 12.0;
const PLOT_W: f64 = W - LEFT - RIGHT;
const PLOT_H: f64 = H - TOP - BOTTOM;

pub const PALETTE: [&str; 8] = [
    "#3566c8", "#e0782f", "#3a9a5b", "#b8423a", "#7d55b5", "#8a6a48", "#c45fa0", "#6b7280",
];

pub fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// One run's colour swatch and label each, above the charts.
pub fn legend(labels: &[&str]) -> Markup {
    html! {
        p.legend {
            @for (run, label) in labels.iter().enumerate() {
                span { i.swatch style={ "background:" (colour(run)) } {} (Text(label)) }
            }
        }
    }
}

/// A value axis from 0: its top and where its ticks are.
#[derive(Debug, PartialEq)]
struct Axis {
    top: f64,
    ticks: Vec<f64>,
}

impl Axis {
    /// At most five ticks from 0 up to `max` or a little above, a step of 1, 2, 2.5 or 5
    /// times a power of ten; for counts (`whole`) the steps are whole numbers and 2.5 is
    /// left out, so no tick reads 1.5 rollouts.
    fn up_to(max: f64, whole: bool) -> Axis {
        let max = if max > 0.0 && max.is_finite() { max } else { 1.0 };
        let rough = max / 4.0;
        let magnitude = 10f64.powf(rough.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .iter()
            .map(|m| m * magnitude)
            .filter(|s| !whole || (*s >= 1.0 && s.fract() == 0.0))
            .find(|s| *s >= rough * (1.0 - 1e-9))
            .unwrap_or(10.0 * magnitude)
            .max(if whole { 1.0 } else { 0.0 });
        let steps = (max / step - 1e-9).ceil().max(1.0) as u32;
        Axis {
            top: step * steps as f64,
            ticks: (0..=steps).map(|i| step * i as f64).collect(),
        }
    }

    fn y(&self, value: f64) -> f64 {
        TOP + PLOT_H * (1.0 - value / self.top)
    }
}

/// A coordinate, to a tenth of a pixel.
fn at(v: f64) -> String {
    format!("{v:.1}")
}

/// A value as a label: whole numbers bare, others to at most two decimals.
fn short(v: f64) -> String {
    if v == v.trunc() {
        return format!("{v:.0}");
    }
    let text = format!("{:.2}", v);
    text.trim_end_matches('0').to_string()
}

fn frame(title: &str, axis: &Axis, y_label: &str, body: Markup, x_axis: Markup) -> Markup {
    let middle = TOP + PLOT_H / 2.0;
    html! {
        figure.chart {
            figcaption { (Text(title)) }
            svg viewBox={ "0 0 " (W) " " (H) } width=(W) height=(H) role="img" aria-label=(Text(title)) {
                @for v in &axis.ticks {
                    line x1=(LEFT) y1=(at(axis.y(*v))) x2=(W - RIGHT) y2=(at(axis.y(*v))) stroke="#ddd" {}
                    text x=(LEFT - 4.0) y=(at(axis.y(*v) + 3.0)) font-size="10" text-anchor="end" fill="#555" { (short(*v)) }
                }
                text x="12" y=(at(middle)) font-size="10" fill="#555" transform={ "rotate(-90 12 " (at(middle)) ")" } text-anchor="middle" { (Text(y_label)) }
                (body)
                (x_axis)
            }
        }
    }
}

/// Bars of counts: `series[run][category]`, grouped by category; `runs` labels each run.
pub fn bars(title: &str, categories: &[String], runs: &[&str], series: &[Vec<u64>], y_label: &str) -> Markup {
    let axis = Axis::up_to(series.iter().flatten().copied().max().unwrap_or(0) as f64, true);
    let group = PLOT_W / categories.len().max(1) as f64;
    let bar = (group * 0.8) / series.len().max(1) as f64;
    let body = html! {
        @for (r, values) in series.iter().enumerate() {
            @for (c, v) in values.iter().enumerate() {
                @let h = PLOT_H * *v as f64 / axis.top;
                rect x=(at(LEFT + group * c as f64 + group * 0.1 + bar * r as f64)) y=(at(TOP + PLOT_H - h)) width=(at((bar - 1.0).max(1.0))) height=(at(h)) fill=(colour(r)) {
                    title { (Text(runs.get(r).copied().unwrap_or(""))) ", " (Text(&categories[c])) ": " (v) }
                }
            }
        }
    };
    let x_axis = html! {
        @for (c, label) in categories.iter().enumerate() {
            text x=(at(LEFT + group * (c as f64 + 0.5))) y=(at(H - BOTTOM + 14.0)) font-size="10" text-anchor="middle" fill="#333" { (Text(label)) }
        }
    };
    frame(title, &axis, y_label, body, x_axis)
}

/// Lines: `series[run]` of (x, y) points; `runs` labels each run. `y_max` fixes the top of
/// the y axis (pass@k's 1), else it fits the data.
pub fn lines(
    title: &str,
    runs: &[&str],
    series: &[Vec<(f64, f64)>],
    x_label: &str,
    y_label: &str,
    y_max: Option<f64>,
) -> Markup {
    let points = series.iter().flatten();
    let x_min = points.clone().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x_max = points.clone().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let axis = Axis::up_to(
        y_max.unwrap_or_else(|| points.clone().map(|p| p.1).fold(0.0, f64::max)),
        false,
    );
    let (x_min, x_max) = if x_min.is_finite() && x_max > x_min {
        (x_min, x_max)
    } else {
        (0.0, 1.0)
    };
    let x_at = |x: f64| LEFT + PLOT_W * (x - x_min) / (x_max - x_min);
    let body = html! {
        @for (r, pts) in series.iter().enumerate() {
            @let path: Vec<String> = pts.iter().map(|&(x, y)| format!("{},{}", at(x_at(x)), at(axis.y(y)))).collect();
            polyline fill="none" stroke=(colour(r)) stroke-width="2" points=(path.join(" ")) {}
            @for &(x, y) in pts {
                circle cx=(at(x_at(x))) cy=(at(axis.y(y))) r="2.5" fill=(colour(r)) {
                    title { (Text(runs.get(r).copied().unwrap_or(""))) ": " (short(x)) ", " (short(y)) }
                }
            }
        }
    };
    // Whole numbers (k) get a tick each when there are few; anything else five ticks.
    let whole = series.iter().flatten().all(|p| p.0.fract() == 0.0) && x_max - x_min <= 12.0;
    let ticks: Vec<f64> = if whole {
        (x_min as i64..=x_max as i64).map(|v| v as f64).collect()
    } else {
        (0..=4).map(|i| x_min + (x_max - x_min) * i as f64 / 4.0).collect()
    };
    let x_axis = html! {
        @for v in ticks {
            text x=(at(x_at(v))) y=(at(H - BOTTOM + 14.0)) font-size="10" text-anchor="middle" fill="#333" { (short(v)) }
        }
        text x=(at(LEFT + PLOT_W / 2.0)) y=(at(H - 6.0)) font-size="10" text-anchor="middle" fill="#555" { (Text(x_label)) }
    };
    frame(title, &axis, y_label, body, x_axis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_axes_have_whole_ticks_and_others_round_ones() {
        assert_eq!(
            Axis::up_to(2.0, true),
            Axis {
                top: 2.0,
                ticks: vec![0.0, 1.0, 2.0]
            }
        );
        assert_eq!(
            Axis::up_to(4.0, true),
            Axis {
                top: 4.0,
                ticks: vec![0.0, 1.0, 2.0, 3.0, 4.0]
            }
        );
        assert_eq!(
            Axis::up_to(7.0, true),
            Axis {
                top: 8.0,
                ticks: vec![0.0, 2.0, 4.0, 6.0, 8.0]
            }
        );
        assert_eq!(
            Axis::up_to(0.0, true),
            Axis {
                top: 1.0,
                ticks: vec![0.0, 1.0]
            }
        );
        assert_eq!(Axis::up_to(1.0, false).ticks, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        assert_eq!(
            Axis::up_to(59.5, false),
            Axis {
                top: 60.0,
                ticks: vec![0.0, 20.0, 40.0, 60.0]
            }
        );
        for max in 1..=2000 {
            let axis = Axis::up_to(max as f64, true);
            assert!(
                axis.top >= max as f64 && axis.ticks.len() <= 6 && axis.ticks.iter().all(|t| t.fract() == 0.0),
                "{max}: {axis:?}"
            );
        }
        assert_eq!(
            (short(0.5), short(0.25), short(3.0), short(14.875)),
            ("0.5".into(), "0.25".into(), "3".into(), "14.88".into())
        );
    }

    #[test]
    fn shapes_are_closed_and_labels_escaped() {
        let chart = bars("t<", &["a\"b".into()], &["<script>"], &[vec![3]], "rollouts").into_string();
        assert!(
            chart.contains("<rect ")
                && chart.contains("</rect>")
                && chart.contains("<line ")
                && chart.contains("</line>"),
            "{chart}"
        );
        assert!(
            chart.contains("&lt;script&gt;, a&quot;b: 3")
                && !chart.contains("<script>")
                && chart.contains("<figcaption>t&lt;</figcaption>"),
            "{chart}"
        );
    }
}
