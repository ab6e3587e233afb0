//! A run's config as the page shows and searches it: nested keys flattened.

use serde_json::Value;

/// A run's config, flattened: `(dotted key, value)`, sorted by key.
pub type Config = Vec<(String, String)>;

/// `{"optim": {"lr": 1e-3}}` as `[("optim.lr", "0.001")]`, sorted by key.
pub fn flatten(config: &Value) -> Vec<(String, String)> {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, v) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            Value::String(s) => out.push((prefix.to_string(), s.clone())),
            Value::Object(_) | Value::Null if prefix.is_empty() => {}
            other => out.push((prefix.to_string(), other.to_string())),
        }
    }
    let mut out = Vec::new();
    walk("", config, &mut out);
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_keys_are_flattened() {
        let v: Value = serde_json::json!({"optim": {"lr": 0.001, "betas": [0.9, 0.99]}, "name": "x", "n": null});
        assert_eq!(
            flatten(&v),
            vec![
                ("n".to_string(), "null".to_string()),
                ("name".into(), "x".into()),
                ("optim.betas".into(), "[0.9,0.99]".into()),
                ("optim.lr".into(), "0.001".into()),
            ]
        );
        assert!(flatten(&serde_json::json!({})).is_empty());
    }
}
