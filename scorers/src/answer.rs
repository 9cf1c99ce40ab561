//! Final-answer matching on the host.

use datasets::AnswerMatch;
use serde::Serialize;

use crate::{Details, TrustLevel, Verdict};

/// What was compared, and how.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AnswerCheck {
    /// The submitted answer (at most 1000 characters kept), or None when none was submitted.
    pub answer: Option<String>,
    pub expected: String,
    /// The rule used, or why it could not be applied.
    #[serde(rename = "match")]
    pub rule: String,
}

/// Compares an answer with the expected one.
pub fn score_answer(expected: &str, answer: Option<&str>, how: &AnswerMatch) -> Verdict {
    let verdict = |ok: bool, check: AnswerCheck| Verdict {
        reward: if ok { 1.0 } else { 0.0 },
        passed: ok,
        timed_out: false,
        trust: TrustLevel::ANSWER,
        details: Details {
            answer: Some(check),
            ..Details::basis("final answer compared on the host")
        },
    };
    let Some(answer) = answer else {
        return verdict(
            false,
            AnswerCheck {
                answer: None,
                expected: truncate(expected, 1000),
                rule: "no answer submitted".into(),
            },
        );
    };
    let (ok, rule) = match how {
        AnswerMatch::Exact => (answer.trim() == expected.trim(), "exact".to_string()),
        AnswerMatch::Regex => match regex_lite_match(expected, answer.trim()) {
            Ok(ok) => (ok, "regex".to_string()),
            Err(e) => (false, format!("bad expected regex: {e}")),
        },
        AnswerMatch::Numeric { tolerance } => match (parse_number(expected), parse_number(answer)) {
            (Some(e), Some(a)) => ((e - a).abs() <= *tolerance, format!("numeric within {tolerance}")),
            (None, _) => (false, "expected answer is not a number".to_string()),
            (_, None) => (false, "answer is not a number".to_string()),
        },
    };
    verdict(
        ok,
        AnswerCheck {
            answer: Some(truncate(answer, 1000)),
            expected: truncate(expected, 1000),
            rule,
        },
    )
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

fn parse_number(s: &str) -> Option<f64> {
    let t = s.trim().trim_end_matches('.').replace(',', "");
    t.parse::<f64>().ok().filter(|x| x.is_finite())
}

/// Whole-string match of `pattern` against `text`.
pub fn regex_lite_match(pattern: &str, text: &str) -> Result<bool, regex::Error> {
    let re = regex::Regex::new(&format!("^(?:{pattern})$"))?;
    Ok(re.is_match(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_regex_and_numeric() {
        assert!(score_answer("Paris", Some("  Paris\n"), &AnswerMatch::Exact).passed);
        assert!(!score_answer("Paris", Some("paris"), &AnswerMatch::Exact).passed);
        assert!(score_answer(r"\d+ apples?", Some("12 apples"), &AnswerMatch::Regex).passed);
        assert!(!score_answer(r"\d+ apples?", Some("twelve apples"), &AnswerMatch::Regex).passed);
        assert!(score_answer("[A-C]", Some("B"), &AnswerMatch::Regex).passed);
        assert!(score_answer("3.14159", Some("3.1416"), &AnswerMatch::Numeric { tolerance: 1e-3 }).passed);
        assert!(!score_answer("3.14159", Some("3.2"), &AnswerMatch::Numeric { tolerance: 1e-3 }).passed);
        assert!(score_answer("1000", Some("1,000."), &AnswerMatch::Numeric { tolerance: 0.0 }).passed);
        let missing = score_answer("x", None, &AnswerMatch::Exact);
        assert_eq!(missing.reward, 0.0);
        assert!(!score_answer("(", Some("("), &AnswerMatch::Regex).passed || regex_lite_match("(", "(").unwrap());
    }

    #[test]
    fn regex_is_anchored_and_backtracks() {
        assert!(regex_lite_match("a.*b", "axxxb").unwrap());
        assert!(regex_lite_match("(yes|no)", "no").unwrap());
        assert!(!regex_lite_match("a.*b", "axxxbc").unwrap());
        assert!(regex_lite_match("[^0-9]+", "abc").unwrap());
        assert!(regex_lite_match(r"\w+@\w+\.com", "me@site.com").unwrap());
        assert!(regex_lite_match("[a", "x").is_err());
    }
}
