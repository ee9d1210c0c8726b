//! Token estimates calibrated by what servers count.
//!
//! [`estimate_request_tokens`](super::estimate_request_tokens) counts a
//! quarter of the bytes, which runs low or high depending on the model's
//! tokenizer, the language and how much of the text is JSON. Each answer
//! says how many prompt tokens the server counted; the ratio of that to the
//! estimate of the same request, per served model, scales later estimates,
//! so the second request on a model is estimated about as the server
//! counts it.

use std::collections::HashMap;

use parking_lot::RwLock;

/// Requests estimated smaller than this teach nothing: framing the
/// estimate cannot see dominates them.
pub const MIN_SAMPLE_TOKENS: u64 = 256;

/// Bounds on a ratio: a server that counts wildly differently is believed
/// only this far.
pub const MIN_RATIO: f64 = 0.25;
/// See [`MIN_RATIO`].
pub const MAX_RATIO: f64 = 4.0;

/// Weight of a new sample once a model has one: later requests move the
/// ratio, a single odd one does not swing it.
const NEW_WEIGHT: f64 = 0.3;

/// Server tokens per estimated token for one served model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    /// The ratio.
    pub ratio: f64,
    /// Samples it was learned from.
    pub samples: u64,
}

/// Ratios per served model, shared by every caller.
#[derive(Debug, Default)]
pub struct Calibration {
    ratios: RwLock<HashMap<String, Ratio>>,
}

impl Calibration {
    /// Server tokens per estimated token for `model` (1 when unknown).
    pub fn ratio(&self, model: &str) -> f64 {
        self.ratios.read().get(model).map_or(1.0, |r| r.ratio)
    }

    /// Every ratio known, by model.
    pub fn all(&self) -> Vec<(String, Ratio)> {
        let mut all: Vec<(String, Ratio)> = self
            .ratios
            .read()
            .iter()
            .map(|(model, ratio)| (model.clone(), *ratio))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Takes back a ratio learned before (from the store).
    pub fn restore(&self, model: String, ratio: Ratio) {
        if ratio.ratio.is_finite() && ratio.ratio > 0.0 {
            let bounded = Ratio {
                ratio: ratio.ratio.clamp(MIN_RATIO, MAX_RATIO),
                ..ratio
            };
            self.ratios.write().insert(model, bounded);
        }
    }

    /// Learns from a request `model` was sent, estimated at `estimated`
    /// tokens, that the server counted as `counted`. Answers the new ratio
    /// when it moved by more than 1% (worth keeping), else `None`.
    pub fn observe(&self, model: &str, estimated: u64, counted: u64) -> Option<Ratio> {
        if estimated < MIN_SAMPLE_TOKENS || counted == 0 {
            return None;
        }
        let sample = (counted as f64 / estimated as f64).clamp(MIN_RATIO, MAX_RATIO);
        let mut ratios = self.ratios.write();
        let next = match ratios.get(model) {
            None => Ratio {
                ratio: sample,
                samples: 1,
            },
            Some(known) => Ratio {
                ratio: known.ratio + NEW_WEIGHT * (sample - known.ratio),
                samples: known.samples.saturating_add(1),
            },
        };
        let before = ratios.insert(model.to_owned(), next);
        let moved = before.is_none_or(|before| (next.ratio / before.ratio - 1.0).abs() > 0.01);
        moved.then_some(next)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_first_sample_is_taken_and_later_ones_move_it() {
        let calibration = Calibration::default();
        assert_eq!(calibration.ratio("m"), 1.0);
        assert_eq!(
            calibration.observe("m", 100, 125),
            None,
            "too small to learn from"
        );
        let first = calibration.observe("m", 5139, 6421).unwrap();
        assert!((first.ratio - 1.2494).abs() < 0.001, "{first:?}");
        assert_eq!(calibration.ratio("other"), 1.0, "per model");
        // The same ratio again: nothing worth keeping.
        assert_eq!(calibration.observe("m", 10_000, 12_494), None);
        let moved = calibration.observe("m", 1000, 2000).unwrap();
        assert!(moved.ratio > 1.4 && moved.ratio < 1.5, "{moved:?}");
        assert_eq!(moved.samples, 3);
    }

    #[test]
    fn ratios_are_bounded() {
        let calibration = Calibration::default();
        calibration.observe("m", 1000, 1_000_000).unwrap();
        assert_eq!(calibration.ratio("m"), MAX_RATIO);
        calibration.restore(
            "n".into(),
            Ratio {
                ratio: f64::NAN,
                samples: 1,
            },
        );
        assert_eq!(calibration.ratio("n"), 1.0);
        calibration.restore(
            "n".into(),
            Ratio {
                ratio: 0.01,
                samples: 1,
            },
        );
        assert_eq!(calibration.ratio("n"), MIN_RATIO);
        assert_eq!(calibration.all().len(), 2);
    }
}
