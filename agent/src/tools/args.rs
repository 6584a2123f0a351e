//! Reading tool arguments into the types of `input.rs`. The input schema a tool lists is derived
//! from its argument type, and a call is read with the same type, so the two cannot differ. Every
//! wrong type or missing value names the argument and says what it must be.

use std::any::TypeId;
use std::borrow::Cow;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, OnceLock};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer};
use serde_json::{Map, Value, json};

/// A bad argument; the text tells the model exactly what to change.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ArgError(pub String);

/// A tool's `inputSchema`: the schema derived from its argument type, inlined, without the
/// Rust-sized number formats.
pub fn input_schema<T: JsonSchema>() -> Value {
    let mut schema = super::output::derived::<T>();
    if let Some(object) = schema.as_object_mut() {
        // Unknown arguments are refused by name when a call is read: saying so in every schema
        // would cost each client's model the words on every turn.
        object.remove("additionalProperties");
        object.entry("properties").or_insert_with(|| Value::Object(Map::new()));
    }
    if let Some(properties) = schema["properties"].as_object_mut() {
        properties.values_mut().for_each(not_null);
    }
    schema
}

/// An optional argument's schema without the `null` its `Option` adds: left out is how a call
/// says "not given" (null is read the same way, but need not be offered).
fn not_null(property: &mut Value) {
    let Some(object) = property.as_object_mut() else { return };
    if let Some(Value::Array(any)) = object.get("anyOf")
        && let [a, b] = any.as_slice()
    {
        let null = json!({ "type": "null" });
        let kept = if *a == null {
            Some(b.clone())
        } else if *b == null {
            Some(a.clone())
        } else {
            None
        };
        if let Some(Value::Object(kept)) = kept {
            object.remove("anyOf");
            for (key, value) in kept {
                object.entry(key).or_insert(value);
            }
        }
    }
    if let Some(Value::Array(types)) = object.get_mut("type") {
        types.retain(|t| t != "null");
        if let [only] = types.as_slice() {
            let only = only.clone();
            object.insert("type".into(), only);
        }
    }
    if let Some(Value::Array(words)) = object.get_mut("enum") {
        words.retain(|w| !w.is_null());
    }
}

/// Reads a call's arguments as `T`. Unknown and missing arguments are found from `T`'s schema
/// first, so their errors name every argument the tool takes or what a missing one must be.
pub fn parse<T: DeserializeOwned + JsonSchema + 'static>(arguments: &Map<String, Value>) -> Result<T, ArgError> {
    let schema = schema_of::<T>();
    let properties = schema["properties"].as_object().expect("an input is an object");
    if let Some(unknown) = arguments.keys().find(|k| !properties.contains_key(k.as_str())) {
        let known: Vec<&str> = properties.keys().map(String::as_str).collect();
        let expected = if known.is_empty() { "none".to_owned() } else { known.join(", ") };
        return Err(ArgError(format!("unknown argument {unknown:?}; this tool takes: {expected}")));
    }
    let required = schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str);
    for key in required {
        if arguments.get(key).is_none_or(Value::is_null) {
            return Err(ArgError(missing(key, &properties[key])));
        }
    }
    serde_path_to_error::deserialize(arguments).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        ArgError(if path.is_empty() || path == "." { inner } else { format!("{path} {inner}") })
    })
}

/// `T`'s input schema, derived once per type (the catalog lists the same).
fn schema_of<T: JsonSchema + 'static>() -> Arc<Value> {
    static SCHEMAS: OnceLock<Mutex<HashMap<TypeId, Arc<Value>>>> = OnceLock::new();
    let mut schemas = SCHEMAS.get_or_init(Mutex::default).lock().unwrap_or_else(|e| e.into_inner());
    schemas.entry(TypeId::of::<T>()).or_insert_with(|| Arc::new(input_schema::<T>())).clone()
}

/// What a missing argument must be, from its schema.
fn missing(key: &str, property: &Value) -> String {
    if let Some(values) = property["enum"].as_array() {
        let values: Vec<&str> = values.iter().filter_map(Value::as_str).collect();
        format!("{key} is required: one of {}", values.join(", "))
    } else if property["type"] == "boolean" {
        format!("{key} is required: true or false")
    } else {
        format!("{key} is required")
    }
}

/// A string, which may be empty.
#[derive(Debug, Clone, Default)]
pub struct Text(pub String);

/// A string with something in it besides blanks; an empty one is as good as missing.
#[derive(Debug, Clone)]
pub struct NonBlank(pub String);

/// `true` or `false`.
#[derive(Debug, Clone, Copy)]
pub struct Flag(pub bool);

impl Flag {
    /// The flag's value, or `default` when it was not given.
    pub fn or(flag: Option<Flag>, default: bool) -> bool {
        flag.map_or(default, |f| f.0)
    }
}

/// A string, or the error saying what the argument must be.
fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => Ok(s),
        other => Err(de::Error::custom(format!("must be a string, not {}", kind_of(&other)))),
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        string(d).map(Text)
    }
}

impl<'de> Deserialize<'de> for NonBlank {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = string(d)?;
        if text.trim().is_empty() {
            return Err(de::Error::custom("is required"));
        }
        Ok(NonBlank(text))
    }
}

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Bool(b) => Ok(Flag(b)),
            other => Err(de::Error::custom(format!("must be true or false, not {}", kind_of(&other)))),
        }
    }
}

macro_rules! plain_schema {
    ($t:ty, $name:literal, $schema:tt) => {
        impl JsonSchema for $t {
            fn schema_name() -> Cow<'static, str> {
                $name.into()
            }
            fn inline_schema() -> bool {
                true
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!($schema)
            }
        }
    };
}

plain_schema!(Text, "Text", { "type": "string" });
// Blank is refused by name when a call is read.
plain_schema!(NonBlank, "NonBlank", { "type": "string" });
plain_schema!(Flag, "Flag", { "type": "boolean" });

/// A JSON number read as a whole number of seconds; `None` when it is no number.
fn number(value: &Value) -> Option<f64> {
    value.as_number().and_then(serde_json::Number::as_f64)
}

/// Whole seconds from 0 to `MAX`, `DEFAULT` when not given; fractions round up so a short wait is
/// never zero.
#[derive(Debug, Clone, Copy)]
pub struct Seconds<const DEFAULT: u32, const MAX: u32>(pub u32);

impl<const DEFAULT: u32, const MAX: u32> Default for Seconds<DEFAULT, MAX> {
    fn default() -> Self {
        Self(DEFAULT)
    }
}

impl<'de, const DEFAULT: u32, const MAX: u32> Deserialize<'de> for Seconds<DEFAULT, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let must = format!("be a number of seconds from 0 to {MAX}");
        match Value::deserialize(d)? {
            Value::Null => Ok(Self(DEFAULT)),
            v @ Value::Number(_) => match number(&v) {
                Some(s) if (0.0..=f64::from(MAX)).contains(&s) => Ok(Self(s.ceil() as u32)),
                _ => Err(de::Error::custom(format!("must {must}"))),
            },
            other => Err(de::Error::custom(format!("must {must}, not {}", kind_of(&other)))),
        }
    }
}

impl<const DEFAULT: u32, const MAX: u32> JsonSchema for Seconds<DEFAULT, MAX> {
    fn schema_name() -> Cow<'static, str> {
        format!("Seconds{DEFAULT}to{MAX}").into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "number", "minimum": 0, "maximum": MAX, "default": DEFAULT })
    }
}

/// A whole number from `MIN` to `MAX`.
#[derive(Debug, Clone, Copy)]
pub struct Count<const MIN: u32, const MAX: u32>(pub u32);

impl<'de, const MIN: u32, const MAX: u32> Deserialize<'de> for Count<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        match number(&value) {
            Some(x) if x.fract() == 0.0 && (f64::from(MIN)..=f64::from(MAX)).contains(&x) => Ok(Self(x as u32)),
            _ => {
                let shown = match &value {
                    Value::Number(n) => n.to_string(),
                    other => kind_of(other).to_owned(),
                };
                Err(de::Error::custom(format!("must be a whole number from {MIN} to {MAX}, not {shown}")))
            }
        }
    }
}

impl<const MIN: u32, const MAX: u32> JsonSchema for Count<MIN, MAX> {
    fn schema_name() -> Cow<'static, str> {
        format!("Count{MIN}to{MAX}").into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "integer", "minimum": MIN, "maximum": MAX })
    }
}

/// What a list of names is of: how an argument taking one or several says what it must be.
pub trait Noun {
    const ONE: &'static str;
    const MANY: &'static str;
}

/// An agent's address.
#[derive(Debug, Clone)]
pub struct Address;
impl Noun for Address {
    const ONE: &'static str = "an address";
    const MANY: &'static str = "addresses";
}

/// A path in a repository.
#[derive(Debug, Clone)]
pub struct Path;
impl Noun for Path {
    const ONE: &'static str = "a path";
    const MANY: &'static str = "paths";
}

/// One `N` or a list of 1 to `MAX` of them, each trimmed and not blank.
#[derive(Debug, Clone)]
pub struct OneOrMore<const MAX: usize, N: Noun>(pub Vec<String>, PhantomData<N>);

pub type Addresses<const MAX: usize> = OneOrMore<MAX, Address>;
pub type Paths<const MAX: usize> = OneOrMore<MAX, Path>;

impl<'de, const MAX: usize, N: Noun> Deserialize<'de> for OneOrMore<MAX, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wrong = || de::Error::custom(format!("must be {} or a list of 1 to {MAX} {}", N::ONE, N::MANY));
        let one = |v: &Value| match v {
            Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
            _ => None,
        };
        let list = match Value::deserialize(d)? {
            Value::Array(items) if (1..=MAX).contains(&items.len()) => {
                items.iter().map(one).collect::<Option<Vec<_>>>().ok_or_else(wrong)?
            }
            single => vec![one(&single).ok_or_else(wrong)?],
        };
        Ok(Self(list, PhantomData))
    }
}

impl<const MAX: usize, N: Noun> JsonSchema for OneOrMore<MAX, N> {
    fn schema_name() -> Cow<'static, str> {
        format!("{}{MAX}", N::MANY).into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // One as a string is read too; the schema offers the list alone. The bounds are said when a
        // call passes them: in every schema they would cost every turn.
        json_schema!({ "type": "array", "items": { "type": "string" } })
    }
}

/// A selector list: a list of strings or one comma-separated string.
#[derive(Debug, Clone)]
pub struct Selectors(pub Vec<String>);

impl From<Selectors> for Vec<String> {
    fn from(selectors: Selectors) -> Self {
        selectors.0
    }
}

impl<'de> Deserialize<'de> for Selectors {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => {
                Ok(Self(s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect()))
            }
            Value::Array(items) => items
                .iter()
                .map(|v| v.as_str().map(|s| s.trim().to_owned()))
                .collect::<Option<Vec<_>>>()
                .map(Self)
                .ok_or_else(|| de::Error::custom("must be a list of selectors")),
            other => Err(de::Error::custom(format!("must be a list of selectors, not {}", kind_of(&other)))),
        }
    }
}

// A list is read too; the schema offers the comma-separated string, the shorter to list.
plain_schema!(Selectors, "Selectors", { "type": "string" });

/// A file to attach: a path on the agent's machine (read by the bridge), or given inline (a
/// remote agent's only way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attach {
    Path(String),
    Inline { name: String, content: Vec<u8> },
}

/// The most files one send attaches (the server says the same).
pub const MAX_ATTACH: usize = 16;

/// One file or a list of 1 to [`MAX_ATTACH`]: each a path, or `{name, text}` or `{name, base64}`.
#[derive(Debug, Clone)]
pub struct Attachments(pub Vec<Attach>);

impl<'de> Deserialize<'de> for Attachments {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let items = match Value::deserialize(d)? {
            Value::Array(items) if (1..=MAX_ATTACH).contains(&items.len()) => items,
            Value::Array(items) => {
                return Err(de::Error::custom(format!("must list 1 to {MAX_ATTACH} files, not {}", items.len())));
            }
            one => vec![one],
        };
        items.into_iter().map(attach).collect::<Result<Vec<_>, String>>().map(Self).map_err(de::Error::custom)
    }
}

/// One file of `attach`.
fn attach(item: Value) -> Result<Attach, String> {
    use base64::Engine as _;
    const MUST: &str = "must be a path, or {name, text} or {name, base64}";
    match item {
        Value::String(path) if !path.trim().is_empty() => Ok(Attach::Path(path.trim().to_owned())),
        Value::Object(mut fields) => {
            let name = match fields.remove("name") {
                Some(Value::String(name)) if !name.trim().is_empty() => name,
                _ => return Err(format!("a file given inline needs a name: each {MUST}")),
            };
            let content = match (fields.remove("text"), fields.remove("base64")) {
                (Some(Value::String(text)), None) => text.into_bytes(),
                (None, Some(Value::String(encoded))) => base64::engine::general_purpose::STANDARD
                    .decode(encoded.trim())
                    .map_err(|e| format!("{name}: base64 does not decode ({e})"))?,
                _ => return Err(format!("{name}: give its content as text or as base64, one of them")),
            };
            if let Some(other) = fields.keys().next() {
                return Err(format!(
                    "{name}: unknown field {other:?}; a file given inline has name and text or base64"
                ));
            }
            Ok(Attach::Inline { name, content })
        }
        other => Err(format!("each file {MUST}, not {}", kind_of(&other))),
    }
}

// Clients that read only simple schemas (Codex) see the paths; an object is read too.
plain_schema!(Attachments, "Attachments", {
    "type": "array", "items": { "anyOf": [{ "type": "string" }, { "type": "object" }] }
});

/// One of a fixed set of words, named by a [`Words`] type.
#[derive(Debug, Clone)]
pub struct OneOf<W: Words>(pub String, PhantomData<W>);

/// A fixed set of words an argument may take.
pub trait Words {
    const NAME: &'static str;
    const WORDS: &'static [&'static str];
}

impl<W: Words> OneOf<W> {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de, W: Words> Deserialize<'de> for OneOf<W> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let word = string(d)?;
        if W::WORDS.contains(&word.as_str()) {
            Ok(Self(word, PhantomData))
        } else {
            Err(de::Error::custom(format!("must be one of {}, not {word:?}", W::WORDS.join(", "))))
        }
    }
}

impl<W: Words> JsonSchema for OneOf<W> {
    fn schema_name() -> Cow<'static, str> {
        W::NAME.into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "enum": W::WORDS })
    }
}

/// A word the schema offers from a fixed set, passed on as given: the server checks it and says
/// what was meant (`in_progress` → `in-progress`).
#[derive(Debug, Clone)]
pub struct Word<W: Words>(pub String, PhantomData<W>);

impl<'de, W: Words> Deserialize<'de> for Word<W> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        string(d).map(|word| Self(word, PhantomData))
    }
}

impl<W: Words> JsonSchema for Word<W> {
    fn schema_name() -> Cow<'static, str> {
        W::NAME.into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "enum": W::WORDS })
    }
}

/// Declares a [`Words`] type: `words!(Decision: "allow", "deny", "owner");`.
macro_rules! words {
    ($name:ident: $($word:literal),+ $(,)?) => {
        #[derive(Debug, Clone)]
        pub struct $name;
        impl $crate::tools::args::Words for $name {
            const NAME: &'static str = stringify!($name);
            const WORDS: &'static [&'static str] = &[$($word),+];
        }
    };
}
pub(crate) use words;

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// An argument a tool needs only for some of its actions.
pub fn needed<T>(value: Option<T>, key: &str) -> Result<T, ArgError> {
    value.ok_or_else(|| ArgError(format!("{key} is required")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    words!(State: "todo", "in-progress");

    #[test]
    fn files_are_paths_or_given_inline_and_anything_else_is_refused_by_what_it_lacks() {
        let read = |v: Value| serde_json::from_value::<Attachments>(v).map(|a| a.0).map_err(|e| e.to_string());
        assert_eq!(read(json!("fix.patch")).unwrap(), [Attach::Path("fix.patch".into())]);
        let both =
            read(json!([" logs/run.txt ", { "name": "n.md", "text": "hi" }, { "name": "b.bin", "base64": "AAH/" }]));
        assert_eq!(
            both.unwrap(),
            [
                Attach::Path("logs/run.txt".into()),
                Attach::Inline { name: "n.md".into(), content: b"hi".to_vec() },
                Attach::Inline { name: "b.bin".into(), content: vec![0, 1, 255] },
            ]
        );
        assert!(read(json!([])).unwrap_err().contains("1 to 16 files"));
        assert!(read(json!([{ "text": "x" }])).unwrap_err().contains("needs a name"));
        assert!(read(json!([{ "name": "a", "text": "x", "base64": "eA==" }])).unwrap_err().contains("one of them"));
        assert!(read(json!([{ "name": "a", "base64": "!!" }])).unwrap_err().contains("does not decode"));
        assert!(read(json!([{ "name": "a", "text": "x", "mode": 1 }])).unwrap_err().contains("unknown field \"mode\""));
        assert!(read(json!([7])).unwrap_err().contains("not a number"));
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Probe {
        body: NonBlank,
        title: Option<Text>,
        ack: Option<Flag>,
        #[serde(default)]
        wait_s: Seconds<30, 300>,
        to: Option<Addresses<32>>,
        turns: Option<Count<1, 10>>,
        state: Option<OneOf<State>>,
        rules: Option<Selectors>,
    }

    fn parse_probe(v: Value) -> Result<Probe, String> {
        parse::<Probe>(v.as_object().unwrap()).map_err(|e| e.0)
    }

    #[test]
    fn type_errors_name_the_argument() {
        assert_eq!(parse_probe(json!({"body": 5})).unwrap_err(), "body must be a string, not a number");
        assert_eq!(
            parse_probe(json!({"body": "x", "ack": "yes"})).unwrap_err(),
            "ack must be true or false, not a string"
        );
        assert_eq!(
            parse_probe(json!({"body": "x", "wait_s": -1})).unwrap_err(),
            "wait_s must be a number of seconds from 0 to 300"
        );
        assert_eq!(
            parse_probe(json!({"body": "x", "wait_s": "soon"})).unwrap_err(),
            "wait_s must be a number of seconds from 0 to 300, not a string"
        );
        assert_eq!(
            parse_probe(json!({"body": "x", "to": []})).unwrap_err(),
            "to must be an address or a list of 1 to 32 addresses"
        );
        assert_eq!(parse_probe(json!({})).unwrap_err(), "body is required");
        assert_eq!(parse_probe(json!({"body": null})).unwrap_err(), "body is required");
        assert_eq!(parse_probe(json!({"body": "  "})).unwrap_err(), "body is required");
        assert_eq!(
            parse_probe(json!({"body": "x", "rules": 3})).unwrap_err(),
            "rules must be a list of selectors, not a number"
        );
    }

    #[test]
    fn unknown_arguments_are_refused_naming_what_the_tool_takes() {
        let err = parse_probe(json!({"bdy": "x"})).unwrap_err();
        assert!(err.starts_with("unknown argument \"bdy\"; this tool takes: body, title, ack, wait_s"), "{err}");
    }

    #[test]
    fn values_are_read() {
        let p = parse_probe(json!({"body": "b", "to": ["a", " b "], "wait_s": 1.2, "title": "", "rules": "a, b,"}))
            .unwrap();
        assert_eq!(p.to.unwrap().0, ["a", "b"]);
        assert_eq!(p.wait_s.0, 2);
        assert_eq!(p.title.unwrap().0, "");
        assert_eq!(p.rules.unwrap().0, ["a", "b"]);
        let defaults = parse_probe(json!({"body": "b", "wait_s": null})).unwrap();
        assert_eq!(defaults.wait_s.0, 30);
        assert!(!Flag::or(defaults.ack, false) && Flag::or(defaults.ack, true));
        assert_eq!(parse_probe(json!({"body": "b", "to": "x/y"})).unwrap().to.unwrap().0, ["x/y"]);
    }

    #[test]
    fn counts_and_words_name_what_is_allowed() {
        assert_eq!(
            parse_probe(json!({"body": "b", "turns": 0})).unwrap_err(),
            "turns must be a whole number from 1 to 10, not 0"
        );
        assert!(parse_probe(json!({"body": "b", "turns": 2.5})).is_err());
        assert_eq!(parse_probe(json!({"body": "b", "turns": 4})).unwrap().turns.unwrap().0, 4);
        assert_eq!(
            parse_probe(json!({"body": "b", "state": "in_progress"})).unwrap_err(),
            "state must be one of todo, in-progress, not \"in_progress\""
        );
        assert_eq!(parse_probe(json!({"body": "b", "state": "todo"})).unwrap().state.unwrap().as_str(), "todo");
    }

    #[test]
    fn the_schema_is_the_type() {
        let schema = input_schema::<Probe>();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["required"], json!(["body"]), "optional and defaulted arguments are not required");
        assert_eq!(
            schema["properties"]["wait_s"],
            json!({"type": "number", "minimum": 0, "maximum": 300, "default": 30})
        );
        assert_eq!(schema["properties"]["state"]["enum"], json!(["todo", "in-progress"]));
        assert_eq!(schema["properties"]["to"], json!({"type": "array", "items": {"type": "string"}}));
        assert_eq!(
            schema["properties"]["title"],
            json!({"type": "string"}),
            "an optional argument is not offered as null"
        );
        assert_eq!(schema["properties"]["state"], json!({"type": "string", "enum": ["todo", "in-progress"]}));
        assert_eq!(schema["properties"]["rules"]["type"], "string", "{}", schema["properties"]["rules"]);
    }

    #[test]
    fn a_required_word_or_flag_says_what_it_takes() {
        #[derive(Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Needs {
            state: OneOf<State>,
            on: Flag,
        }
        let needs = |v: Value| parse::<Needs>(v.as_object().unwrap()).err().unwrap().0;
        assert_eq!(needs(json!({"on": true})), "state is required: one of todo, in-progress");
        assert_eq!(needs(json!({"state": "todo"})), "on is required: true or false");
    }
}
