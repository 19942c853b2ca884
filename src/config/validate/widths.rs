//! The widths a ps takes from the chief: a ps started with `model.hidden`
//! does not read the data set (`ps::widths`).

use super::super::schema::Config;
use super::ConfigError;

impl Config {
    /// Takes the chief's `layers` (input first) as this task's model: they
    /// must be `model.hidden` with one width before and one after, and fit
    /// in memory ([`Config::resolve_layers`]).
    ///
    /// Errors: [`ConfigError::Key`] naming `model.hidden` when the widths
    /// are another model's, or the bound they pass.
    pub fn learn_widths(&mut self, layers: &[usize]) -> Result<(), ConfigError> {
        let hidden = self.model.hidden.clone().unwrap_or_default();
        let fits = layers.len() == hidden.len() + 2
            && layers[1..layers.len() - 1] == hidden[..]
            && layers.iter().all(|&w| w > 0);
        if !fits {
            return Err(self.bad(
                "model.hidden",
                format!(
                    "is {hidden:?}, but the chief's model has the widths {layers:?}: every task \
                     must have the same model.hidden"
                ),
            ));
        }
        self.resolve_layers(layers[0], layers[layers.len() - 1], "the chief's model")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hidden(widths: &str) -> Config {
        Config::from_toml_str(&format!("[model]\nhidden = [{widths}]\n"), "f").unwrap()
    }

    #[test]
    fn the_chief_s_widths_around_the_same_hidden_ones_are_taken() {
        let mut c = hidden("16, 8");
        c.learn_widths(&[5, 16, 8, 3]).unwrap();
        assert_eq!(c.model.layers, [5, 16, 8, 3]);
    }

    #[test]
    fn another_model_s_widths_are_refused_naming_model_hidden() {
        for other in [
            &[5, 16, 3][..],
            &[5, 16, 9, 3],
            &[5, 8, 16, 3],
            &[],
            &[0, 16, 8, 3],
        ] {
            let err = hidden("16, 8").learn_widths(other).unwrap_err().to_string();
            assert!(err.contains("model.hidden"), "{other:?}: {err}");
            assert!(err.contains("[16, 8]"), "{err}");
        }
    }

    #[test]
    fn widths_past_this_host_s_memory_are_refused() {
        let err = hidden("16")
            .learn_widths(&[usize::MAX / 8, 16, 2])
            .unwrap_err()
            .to_string();
        assert!(err.contains("model"), "{err}");
    }
}
