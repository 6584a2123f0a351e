//! Reading tool arguments: every wrong type or missing value names the argument.

use serde_json::{Map, Value};

/// A bad argument; the text tells the model exactly what to change.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ArgError(pub String);

pub struct Args<'a> {
    map: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    /// Checks that only `known` arguments were given.
    pub fn new(map: &'a Map<String, Value>, known: &[&str]) -> Result<Self, ArgError> {
        if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
            let expected = if known.is_empty() { "none".to_owned() } else { known.join(", ") };
            return Err(ArgError(format!("unknown argument {unknown:?}; this tool takes: {expected}")));
        }
        Ok(Self { map })
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ArgError> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(ArgError(format!("{key} must be a string, not {}", kind(other)))),
        }
    }

    pub fn str(&self, key: &str) -> Result<&'a str, ArgError> {
        match self.opt_str(key)? {
            Some(s) if !s.trim().is_empty() => Ok(s),
            _ => Err(ArgError(format!("{key} is required"))),
        }
    }

    /// A string that may be empty (clearing a title, say) but must be present.
    pub fn str_allow_empty(&self, key: &str) -> Result<&'a str, ArgError> {
        self.opt_str(key)?.ok_or_else(|| ArgError(format!("{key} is required")))
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, ArgError> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(ArgError(format!("{key} must be true or false, not {}", kind(other)))),
        }
    }

    /// Whole seconds from 0 to `max`; fractions round up so a short wait is never zero.
    pub fn seconds(&self, key: &str, default: u32, max: u32) -> Result<u32, ArgError> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(v) if (0.0..=f64::from(max)).contains(&v) => Ok(v.ceil() as u32),
                _ => Err(ArgError(format!("{key} must be a number of seconds from 0 to {max}"))),
            },
            Some(other) => {
                Err(ArgError(format!("{key} must be a number of seconds from 0 to {max}, not {}", kind(other))))
            }
        }
    }

    /// A whole number from `min` to `max`.
    pub fn count(&self, key: &str, default: u32, min: u32, max: u32) -> Result<u32, ArgError> {
        let wrong = |v: &Value| ArgError(format!("{key} must be a whole number from {min} to {max}, not {}", shown(v)));
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v @ Value::Number(n)) => match n.as_f64() {
                Some(x) if x.fract() == 0.0 && (f64::from(min)..=f64::from(max)).contains(&x) => Ok(x as u32),
                _ => Err(wrong(v)),
            },
            Some(other) => Err(wrong(other)),
        }
    }

    /// One address or a list of 1 to `max` addresses.
    pub fn addresses(&self, key: &str, max: usize) -> Result<Vec<String>, ArgError> {
        let wrong = || ArgError(format!("{key} must be an address or a list of 1 to {max} addresses"));
        match self.map.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(vec![s.trim().to_owned()]),
            Some(Value::Array(items)) if (1..=max).contains(&items.len()) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) if !s.trim().is_empty() => Ok(s.trim().to_owned()),
                    _ => Err(wrong()),
                })
                .collect(),
            None | Some(Value::Null) => Err(ArgError(format!("{key} is required"))),
            Some(_) => Err(wrong()),
        }
    }
}

impl<'a> Args<'a> {
    /// A selector list: a list of strings or one comma-separated string; absent stays absent.
    pub fn selectors(&self, key: &str) -> Result<Option<Vec<String>>, ArgError> {
        let split = |s: &str| s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect();
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(split(s))),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(|s| s.trim().to_owned()))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| ArgError(format!("{key} must be a list of selectors"))),
            Some(other) => Err(ArgError(format!("{key} must be a list of selectors, not {}", kind(other)))),
        }
    }

    /// The value as given, whatever its type.
    pub fn raw(&self, key: &str) -> Option<&Value> {
        self.map.get(key)
    }

    /// One of a fixed set of words.
    pub fn one_of(&self, key: &str, values: &[&str]) -> Result<&'a str, ArgError> {
        match self.opt_str(key)? {
            Some(v) if values.contains(&v) => Ok(v),
            Some(v) => Err(ArgError(format!("{key} must be one of {}, not {v:?}", values.join(", ")))),
            None => Err(ArgError(format!("{key} is required: one of {}", values.join(", ")))),
        }
    }
}

/// A value as a message quotes it: short values whole, others by kind.
fn shown(value: &Value) -> String {
    match value {
        Value::Number(n) => n.to_string(),
        other => kind(other).to_owned(),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn type_errors_name_the_argument() {
        let m = map(json!({"body": 5, "ack": "yes", "wait_s": -1, "to": []}));
        let a = Args::new(&m, &["body", "ack", "wait_s", "to"]).unwrap();
        assert_eq!(a.str("body").unwrap_err().0, "body must be a string, not a number");
        assert_eq!(a.opt_bool("ack").unwrap_err().0, "ack must be true or false, not a string");
        assert!(a.seconds("wait_s", 0, 300).unwrap_err().0.starts_with("wait_s must be"));
        assert!(a.addresses("to", 32).unwrap_err().0.starts_with("to must be"));
        assert_eq!(a.str("missing").unwrap_err().0, "missing is required");
    }

    #[test]
    fn unknown_arguments_are_refused() {
        let m = map(json!({"bdy": "x"}));
        let err = Args::new(&m, &["to", "body"]).err().unwrap().0;
        assert!(err.contains("\"bdy\"") && err.contains("to, body"), "{err}");
    }

    #[test]
    fn values_are_read() {
        let m = map(json!({"to": ["a", " b "], "wait_s": 1.2, "title": ""}));
        let a = Args::new(&m, &["to", "wait_s", "title"]).unwrap();
        assert_eq!(a.addresses("to", 32).unwrap(), ["a", "b"]);
        assert_eq!(a.seconds("wait_s", 30, 300).unwrap(), 2);
        assert_eq!(a.seconds("absent", 30, 300).unwrap(), 30);
        assert_eq!(a.str_allow_empty("title").unwrap(), "");
        assert!(a.str("title").is_err());
    }

    #[test]
    fn counts_and_words_name_what_is_allowed() {
        let m = map(json!({"turns": 0, "half": 2.5, "state": "in_progress"}));
        let a = Args::new(&m, &["turns", "half", "state"]).unwrap();
        assert_eq!(a.count("turns", 3, 1, 10).unwrap_err().0, "turns must be a whole number from 1 to 10, not 0");
        assert!(a.count("half", 3, 1, 10).is_err());
        assert_eq!(a.count("absent", 3, 1, 10).unwrap(), 3);
        let err = a.one_of("state", &["todo", "in-progress"]).unwrap_err().0;
        assert_eq!(err, "state must be one of todo, in-progress, not \"in_progress\"");
        assert_eq!(a.one_of("absent", &["todo"]).unwrap_err().0, "absent is required: one of todo");
    }
}
