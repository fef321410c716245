//! Which fault an attempt gets: a pure function of the seed, the operation and the attempt, so
//! a run is reproduced by its seed whatever the scheduling.

use super::Fault;

/// SplitMix64's finaliser (the crate's jitter RNG uses the same).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform number in `[0, 1)` for (seed, operation, attempt).
pub(crate) fn uniform(seed: u64, operation: u64, attempt: u32) -> f64 {
    let z = mix(seed ^ mix(operation ^ mix(u64::from(attempt))));
    (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// The fault drawn for (seed, operation, attempt) among `faults` (each with its probability,
/// summing to at most 1), or `None`: the attempt goes through untouched.
pub(crate) fn draw(
    seed: u64,
    operation: u64,
    attempt: u32,
    faults: &[(Fault, f64)],
) -> Option<Fault> {
    let u = uniform(seed, operation, attempt);
    let mut edge = 0.0;
    for (fault, p) in faults {
        edge += p;
        if u < edge {
            return Some(*fault);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_same_seed_draws_the_same_faults_and_rates_hold() {
        let faults = [
            (Fault::Overloaded, 0.2),
            (Fault::ResetAfterWork, 0.1),
            (Fault::Latency(Duration::from_millis(5)), 0.3),
        ];
        let run = |seed| {
            (0..20_000u64)
                .map(|op| draw(seed, op, 1, &faults))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let drawn = run(7);
        let share = |f: Fault| drawn.iter().filter(|d| **d == Some(f)).count() as f64 / 20_000.0;
        assert!((share(Fault::Overloaded) - 0.2).abs() < 0.015);
        assert!((share(Fault::ResetAfterWork) - 0.1).abs() < 0.015);
        assert!((share(Fault::Latency(Duration::from_millis(5))) - 0.3).abs() < 0.015);
        // Attempts of one operation draw independently.
        let attempts: Vec<_> = (1..200).map(|a| draw(7, 42, a, &faults)).collect();
        assert!(attempts.iter().any(Option::is_none) && attempts.iter().any(Option::is_some));
    }
}
