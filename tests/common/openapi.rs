//! A validator for the subset of OpenAPI 3.0 schema objects the vendored
//! specs use: `$ref`, `type`, `nullable`, `properties`, `required`, `items`,
//! `enum`, `allOf`/`oneOf`/`anyOf` and the `uuid`/`date-time` formats.
//! It exists so that the fake server's answers are checked against the
//! official document rather than against our own idea of it.

use serde_json::Value;

pub struct Spec {
    doc: Value,
    /// The media type answers are described under.
    media: &'static str,
}

impl Spec {
    /// The Metal document (`spec/metal/`).
    pub fn load() -> Spec {
        Spec::vendored("metal", "application/json")
    }

    /// Latitude.sh's document (`spec/latitude/`).
    #[allow(dead_code)]
    pub fn latitude() -> Spec {
        Spec::vendored("latitude", "application/vnd.api+json")
    }

    fn vendored(provider: &str, media: &'static str) -> Spec {
        let path = format!(
            "{}/spec/{provider}/openapi.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("cannot read the vendored spec at {path} (see spec/{provider}/README.md): {e}")
        });
        Spec {
            doc: serde_json::from_str(&text).expect("a vendored spec is JSON"),
            media,
        }
    }

    /// The schema of `method path`'s answer with `status`, e.g.
    /// `("get", "/devices/{id}", "200")`. `None` when the spec gives no body.
    pub fn response_schema(&self, method: &str, path: &str, status: &str) -> Option<&Value> {
        let op = &self.doc["paths"][path][method];
        assert!(op.is_object(), "the spec has no {method} {path}");
        let response = &op["responses"][status];
        assert!(
            response.is_object(),
            "the spec gives no {status} answer for {method} {path}"
        );
        let schema = &response["content"][self.media]["schema"];
        schema.is_object().then_some(schema)
    }

    /// Whether `method path`'s answer with `status` has a body of this
    /// spec's media type at all (some list the type without a schema).
    #[allow(dead_code)]
    pub fn has_body(&self, method: &str, path: &str, status: &str) -> bool {
        self.doc["paths"][path][method]["responses"][status]["content"]
            .get(self.media)
            .is_some()
    }

    pub fn component(&self, name: &str) -> &Value {
        let s = &self.doc["components"]["schemas"][name];
        assert!(s.is_object(), "no schema {name}");
        s
    }

    /// Every violation of `schema` by `value`, as `path: problem` lines.
    pub fn validate(&self, schema: &Value, value: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        self.check(schema, value, "$", &mut errors);
        errors
    }

    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                let pointer = r.strip_prefix('#').expect("only local references");
                let target = self.doc.pointer(pointer).expect("a reference resolves");
                self.resolve(target)
            }
            None => schema,
        }
    }

    fn check(&self, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
        let schema = self.resolve(schema);
        if value.is_null() {
            // The real API answers a page's missing neighbours as null
            // (recorded in packet-python's fixtures), which clients expect,
            // though the document does not mark them nullable.
            if at.ends_with(".meta.next") || at.ends_with(".meta.previous") {
                return;
            }
            // `nullable` may sit beside an allOf that wraps a $ref.
            if schema.get("nullable") == Some(&Value::Bool(true)) {
                return;
            }
            if schema.get("type").is_none() && schema.get("allOf").is_none() {
                return;
            }
            errors.push(format!("{at}: null where the schema is not nullable"));
            return;
        }
        if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
            for s in all {
                self.check(s, value, at, errors);
            }
        }
        for key in ["oneOf", "anyOf"] {
            if let Some(options) = schema.get(key).and_then(Value::as_array) {
                let fits = options
                    .iter()
                    .filter(|s| self.validate(s, value).is_empty())
                    .count();
                let ok = if key == "oneOf" { fits == 1 } else { fits >= 1 };
                if !ok {
                    errors.push(format!("{at}: matches {fits} of the {key} options"));
                }
            }
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
            && !allowed.contains(value)
        {
            errors.push(format!("{at}: {value} is not one of {allowed:?}"));
        }
        match schema.get("type").and_then(Value::as_str) {
            Some("object") | None if value.is_object() => {
                self.check_object(schema, value, at, errors)
            }
            Some("object") => errors.push(format!("{at}: expected an object, got {value}")),
            Some("array") => match value.as_array() {
                Some(items) => {
                    if let Some(item_schema) = schema.get("items") {
                        for (i, item) in items.iter().enumerate() {
                            self.check(item_schema, item, &format!("{at}[{i}]"), errors);
                        }
                    }
                }
                None => errors.push(format!("{at}: expected an array, got {value}")),
            },
            Some("string") => match value.as_str() {
                Some(s) => check_format(schema, s, at, errors),
                None => errors.push(format!("{at}: expected a string, got {value}")),
            },
            Some("integer") if !(value.is_i64() || value.is_u64()) => {
                errors.push(format!("{at}: expected an integer, got {value}"))
            }
            Some("number") if !value.is_number() => {
                errors.push(format!("{at}: expected a number, got {value}"))
            }
            Some("boolean") if !value.is_boolean() => {
                errors.push(format!("{at}: expected a boolean, got {value}"))
            }
            _ => {}
        }
    }

    fn check_object(&self, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
        let object = value.as_object().expect("checked by the caller");
        if let Some(required) = schema.get("required").and_then(Value::as_array) {
            for name in required.iter().filter_map(Value::as_str) {
                if !object.contains_key(name) {
                    errors.push(format!("{at}: missing required {name}"));
                }
            }
        }
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            for (name, v) in object {
                if let Some(p) = properties.get(name) {
                    self.check(p, v, &format!("{at}.{name}"), errors);
                }
            }
        }
    }
}

fn check_format(schema: &Value, s: &str, at: &str, errors: &mut Vec<String>) {
    match schema.get("format").and_then(Value::as_str) {
        Some("uuid") if uuid::Uuid::parse_str(s).is_err() => {
            errors.push(format!("{at}: {s:?} is not a uuid"))
        }
        Some("date-time") if chrono::DateTime::parse_from_rfc3339(s).is_err() => {
            errors.push(format!("{at}: {s:?} is not an RFC 3339 date-time"))
        }
        _ => {}
    }
}
