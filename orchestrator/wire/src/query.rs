//! Query strings as the API, the server and the node endpoint speak them:
//! percent-encoded values in, decoded pairs out (one parser for all of them).

use specs::api::ApiError;

pub fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A decoded query string, pairs in order.
pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(query: &str) -> Result<Query, ApiError> {
        let mut out = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(k).map_err(|problem| bad_field("(query)", format!("{problem} in {k:?}")))?;
            let value = percent_decode(v).map_err(|problem| bad_field(&key, format!("{problem} in {v:?}")))?;
            out.push((key, value));
        }
        Ok(Query(out))
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn flag(&self, key: &str) -> Result<bool, ApiError> {
        match self.get(key) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") | Some("") => Ok(true),
            Some(v) => Err(bad_field(key, format!("{v:?}: expected true or false"))),
        }
    }

    /// A non-negative integer parameter, absent when missing (an empty value
    /// is no number: refused rather than read as absent).
    pub fn number(&self, key: &str) -> Result<Option<u64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                v.parse::<u64>().map(Some).map_err(|_| bad_field(key, format!("{v:?} is not a non-negative integer")))
            }
        }
    }
}

/// 400 naming the parameter at fault (`(query)` when even its name is unreadable).
fn bad_field(field: &str, problem: String) -> ApiError {
    ApiError::bad_field(field, problem)
}

fn percent_decode(s: &str) -> Result<String, &'static str> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let v = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match v {
                    Some(v) => out.push(v),
                    None => return Err("bad percent-encoding"),
                }
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "not UTF-8 once decoded")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_values_decode_to_themselves() {
        for v in ["plain", "a b&c=d", "ünï/%+"] {
            let q = Query::parse(&format!("k={}&f", percent_encode(v))).expect("parse");
            assert_eq!(q.get("k"), Some(v));
            assert!(q.flag("f").expect("flag"));
        }
        let fields = |q: &str| Query::parse(q).err().map(|e| (e.code, e.details[0].field.clone()));
        assert_eq!(fields("k=%zz"), Some((400, "k".to_string())));
        assert_eq!(fields("%zz=1"), Some((400, "(query)".to_string())));
        assert_eq!(fields("k=%ff"), Some((400, "k".to_string())));
        assert!(Query::parse("f=maybe").expect("parse").flag("f").is_err());
    }
}
