//! Drawing descriptor values from the key space.

use std::sync::atomic::{AtomicU64, Ordering};

use fastrand::Rng;

/// The largest key space the Zipf table is built for: the table costs 8 bytes per key.
pub const MAX_ZIPF_KEYS: u64 = 10_000_000;

/// Draws key indices in `0..keys`, uniformly or Zipf-skewed.
#[derive(Debug)]
pub enum KeySampler {
    /// Every index equally likely.
    Uniform {
        /// Size of the key space.
        keys: u64,
    },
    /// Index r drawn with probability proportional to 1/(r+1)^s, by inverting the cumulative
    /// distribution with a binary search.
    Zipf {
        /// `cdf[r]` = P(index <= r); the last entry is 1.
        cdf: Vec<f64>,
    },
    /// Every index in turn, shared by all the draws of a phase: `first`, `first + 1`, ...,
    /// `first + keys - 1`, then from `first` again; so `n × keys` draws give each index exactly
    /// `n` times.
    Sequential {
        /// The first index.
        first: u64,
        /// How many indices it goes through.
        keys: u64,
        /// Draws so far.
        next: AtomicU64,
    },
}

/// Why a sampler could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    /// The Zipf table would be too large.
    #[error("--distribution zipf supports at most {MAX_ZIPF_KEYS} keys, got {0}")]
    TooManyZipfKeys(u64),
}

impl KeySampler {
    /// A uniform sampler over `0..keys` (`keys` >= 1).
    pub fn uniform(keys: u64) -> Self {
        KeySampler::Uniform { keys: keys.max(1) }
    }

    /// A sampler that goes through `first..first + keys` in turn (`keys` >= 1); with one key,
    /// always `first`.
    pub fn sequential(first: u64, keys: u64) -> Self {
        KeySampler::Sequential {
            first,
            keys: keys.max(1),
            next: AtomicU64::new(0),
        }
    }

    /// A Zipf sampler over `0..keys` with exponent `exponent` (finite, >= 0).
    pub fn zipf(keys: u64, exponent: f64) -> Result<Self, SamplerError> {
        if keys > MAX_ZIPF_KEYS {
            return Err(SamplerError::TooManyZipfKeys(keys));
        }
        let keys = keys.max(1);
        let mut cdf = Vec::with_capacity(keys as usize);
        let mut total = 0.0_f64;
        for rank in 1..=keys {
            total += (rank as f64).powf(-exponent);
            cdf.push(total);
        }
        for weight in &mut cdf {
            *weight /= total;
        }
        // Rounding may leave the last entry a hair below 1; a draw must never fall past it.
        if let Some(last) = cdf.last_mut() {
            *last = 1.0;
        }
        Ok(KeySampler::Zipf { cdf })
    }

    /// Draws one key index.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        match self {
            KeySampler::Uniform { keys } => rng.u64(0..*keys),
            KeySampler::Zipf { cdf } => {
                let u = rng.f64();
                let index = cdf.partition_point(|&p| p <= u);
                index.min(cdf.len().saturating_sub(1)) as u64
            }
            KeySampler::Sequential { first, keys, next } => {
                first + next.fetch_add(1, Ordering::Relaxed) % keys
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(sampler: &KeySampler, keys: usize, draws: usize) -> Vec<usize> {
        let mut rng = Rng::with_seed(7);
        let mut counts = vec![0; keys];
        for _ in 0..draws {
            let index = sampler.sample(&mut rng) as usize;
            counts[index] += 1;
        }
        counts
    }

    #[test]
    fn uniform_stays_in_range_and_covers_it() {
        let counts = histogram(&KeySampler::uniform(10), 10, 10_000);
        assert!(counts.iter().all(|&c| c > 800 && c < 1200), "{counts:?}");
    }

    #[test]
    fn sequential_gives_each_index_in_turn() {
        let sampler = KeySampler::sequential(10, 3);
        let mut rng = Rng::with_seed(1);
        let drawn: Vec<u64> = (0..7).map(|_| sampler.sample(&mut rng)).collect();
        assert_eq!(drawn, [10, 11, 12, 10, 11, 12, 10]);
        let one = KeySampler::sequential(4, 1);
        assert!((0..5).all(|_| one.sample(&mut rng) == 4));
    }

    #[test]
    fn zipf_follows_its_weights() {
        // With s = 1 over 100 keys, rank 0 has probability 1/H(100) ~ 0.193 and rank 1 half that.
        let sampler = KeySampler::zipf(100, 1.0).unwrap();
        let counts = histogram(&sampler, 100, 100_000);
        assert!((17_500..21_000).contains(&counts[0]), "{}", counts[0]);
        assert!((8_500..10_800).contains(&counts[1]), "{}", counts[1]);
        assert!(counts[0] > counts[9] && counts[9] > counts[99]);
    }

    #[test]
    fn zipf_with_exponent_zero_is_uniform() {
        let sampler = KeySampler::zipf(10, 0.0).unwrap();
        let counts = histogram(&sampler, 10, 10_000);
        assert!(counts.iter().all(|&c| c > 800 && c < 1200), "{counts:?}");
    }

    #[test]
    fn zipf_single_key_and_bounds() {
        let one = KeySampler::zipf(1, 1.0).unwrap();
        assert_eq!(histogram(&one, 1, 100), vec![100]);
        assert!(KeySampler::zipf(MAX_ZIPF_KEYS + 1, 1.0).is_err());
        let steep = KeySampler::zipf(1000, 5.0).unwrap();
        let mut rng = Rng::with_seed(1);
        assert!((0..10_000).all(|_| steep.sample(&mut rng) < 1000));
    }
}
