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
            out.push((percent_decode(k)?, percent_decode(v)?));
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
            Some(v) => Err(bad_request(format!("{key}={v:?}: expected true or false"))),
        }
    }

    /// A non-negative integer parameter, absent when missing or empty.
    pub fn number(&self, key: &str) -> Result<Option<u64>, ApiError> {
        match self.get(key) {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .map(Some)
                .map_err(|_| bad_request(format!("{key} {v:?} is not a non-negative integer"))),
        }
    }
}

fn bad_request(message: String) -> ApiError {
    ApiError { code: 400, reason: "BadRequest".into(), message, details: Vec::new() }
}

fn percent_decode(s: &str) -> Result<String, ApiError> {
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
                    None => return Err(bad_request(format!("bad percent-encoding in query {s:?}"))),
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
    String::from_utf8(out).map_err(|_| bad_request(format!("query {s:?} is not UTF-8")))
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
        assert_eq!(Query::parse("k=%zz").err().map(|e| e.code), Some(400));
        assert!(Query::parse("f=maybe").expect("parse").flag("f").is_err());
    }
}
