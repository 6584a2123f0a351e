//! The redactor measured against what its rules' author did not write: gitleaks' own true and
//! false positive examples (`vendor/gitleaks/examples.json`, made from gitleaks' sources by
//! `vendor/gitleaks/examples.py`). Every true positive must be found by the whole redactor, as an
//! agent's text meets it; every false positive must pass its own rule, as gitleaks holds it. The
//! figures are printed (nextest shows this test's output, `.config/nextest.toml`).

use serde::Deserialize;

use super::{COMPILED, Detector, View, redact, vendored_secret};

#[derive(Deserialize)]
struct Examples {
    rule: String,
    tps: Vec<String>,
    fps: Vec<String>,
}

const EXAMPLES: &str = include_str!("../../../vendor/gitleaks/examples.json");

/// Whether gitleaks' rule `id` alone finds a secret in `text`.
fn rule_finds(id: &str, text: &str) -> bool {
    let compiled = &*COMPILED;
    let view = View::of(text);
    compiled.detectors.iter().any(|detector| match detector {
        Detector::Vendored(rule) if rule.id == id => {
            // As gitleaks runs it: only where one of its keywords is.
            let lower = view.text.to_ascii_lowercase();
            (rule.keywords.is_empty() || rule.keywords.iter().any(|k| lower.contains(k.as_str())))
                && rule
                    .regex
                    .captures_iter(&view.text)
                    .any(|caps| vendored_secret(rule, &caps, &view.text, compiled).is_some())
        }
        _ => false,
    })
}

#[test]
fn gitleaks_own_examples_are_caught_and_its_near_misses_left_alone() {
    let examples: Vec<Examples> = serde_json::from_str(EXAMPLES).expect("examples.json parses");
    let (mut positives, mut caught, mut missed) = (0, 0, Vec::new());
    let (mut negatives, mut found) = (0, Vec::new());
    let skipped: Vec<&str> = examples
        .iter()
        .map(|e| e.rule.as_str())
        .filter(|id| !COMPILED.detectors.iter().any(|d| matches!(d, Detector::Vendored(r) if r.id == *id)))
        .collect();
    for rule in &examples {
        // Examples of a rule the released rule set does not hold (retired, or for file paths).
        if skipped.contains(&rule.rule.as_str()) {
            continue;
        }
        for tp in &rule.tps {
            positives += 1;
            if redact(tp).total() > 0 {
                caught += 1;
            } else {
                missed.push(format!("{}: {tp:?}", rule.rule));
            }
        }
        for fp in &rule.fps {
            negatives += 1;
            if rule_finds(&rule.rule, fp) {
                found.push(format!("{}: {fp:?}", rule.rule));
            }
        }
    }
    let share = 100.0 * caught as f64 / positives as f64;
    println!(
        "gitleaks' examples: {caught} of {positives} true positives caught ({share:.1}%); {} of {negatives} false positives found by their rule; examples of rules the rule set does not hold, left out: {skipped:?}",
        found.len()
    );
    for miss in missed.iter().take(40) {
        println!("  missed {miss}");
    }
    assert!(share >= 95.0, "{share:.1}% of gitleaks' true positives caught");
    assert!(found.is_empty(), "false positives found:\n{}", found.join("\n"));
}
