//! Order statistics for the benchmarks' latency samples (milliseconds).

/// The `p`-th percentile (0 to 100) by nearest rank on the sorted samples;
/// NaN when there are none.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return f64::NAN;
    }
    let idx = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
    s[idx.min(s.len() - 1)]
}

/// Median, p99 and minimum of a set of samples.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub median: f64,
    pub p99: f64,
    pub min: f64,
}

impl Summary {
    pub fn of(samples: &[f64]) -> Summary {
        Summary {
            median: percentile(samples, 50.0),
            p99: percentile(samples, 99.0),
            min: samples.iter().copied().fold(f64::NAN, f64::min),
        }
    }
}

/// The 1-minute load average, as `/proc/loadavg` says (NaN if unreadable).
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 51.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        let s = Summary::of(&v);
        assert_eq!((s.median, s.p99, s.min), (51.0, 99.0, 1.0));
        assert!(percentile(&[], 50.0).is_nan());
    }
}
