//! The 64-bit id of a categorical value: [`id`].
//!
//! Every reader (RecBole, CSV, Criteo, the synthetic generator) turns a
//! field's value into its id here and nowhere else, so the same value of the
//! same field is the same embedding row whatever file it came from. There is
//! no vocabulary file: the id is a hash, and the embedding tables are keyed
//! by it (the "no vocabulary file", as TFRA's dynamic embeddings and
//! Monolith's hash tables do).

use xxhash_rust::xxh3::Xxh3;

/// The byte between a field's name and its value in the hashed input
/// (ASCII unit separator): a name cannot end in it, so ("ab", "c") and
/// ("a", "bc") hash different bytes.
pub const SEPARATOR: u8 = 0x1f;

/// The id of `value` in the categorical field `field`:
/// `xxh3_64(field bytes ++ [0x1f] ++ value bytes)`, seed 0.
///
/// **Stable forever.** Checkpoints hold embedding rows keyed by these ids and
/// a model is served from them long after training: a change here makes
/// every trained table a table of strangers. Never change the hash, its
/// seed, the separator or the order; a test pins known values.
///
/// A missing value is the empty string: `id(field, "")` is its own row.
pub fn id(field: &str, value: &str) -> u64 {
    let mut h = Xxh3::new();
    h.update(field.as_bytes());
    h.update(&[SEPARATOR]);
    h.update(value.as_bytes());
    h.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_xxh3_of_field_separator_value_and_never_change() {
        // Pinned values, computed outside dtf with the reference xxHash
        // (Python's `xxhash.xxh3_64_intdigest(b"user_id\x1f196")`). If this
        // test fails, the ids changed and every checkpoint's tables no longer
        // match their data: fix the code, never these numbers.
        assert_eq!(id("user_id", "196"), 0x375b_77fa_a4c0_752f);
        assert_eq!(id("genre", ""), 0xa128_3618_5887_6945);
        assert_eq!(id("C1", "68fd1e64"), 0x3109_e3d6_a97b_3032);
    }

    #[test]
    fn field_and_value_are_kept_apart() {
        assert_ne!(id("ab", "c"), id("a", "bc"));
        assert_ne!(id("zip", "1"), id("age", "1"));
        assert_ne!(id("zip", ""), id("zip", " "));
        assert_eq!(id("zip", "02134"), id("zip", "02134"));
    }
}
