// Shared by the test binaries: "every field of the input survives in the output".

/// Checks that `outer` keeps everything `inner` has: same scalars, every object key, and every array element in
/// the same relative order (elements may be inserted around them). Returns the JSON pointer of the first loss.
pub fn contains(
    outer: &serde_json::Value,
    inner: &serde_json::Value,
    path: &str,
) -> Result<(), String> {
    use serde_json::Value;
    match (outer, inner) {
        (Value::Object(o), Value::Object(i)) => {
            for (k, v) in i {
                let p = format!("{path}/{}", k.replace('~', "~0").replace('/', "~1"));
                match o.get(k) {
                    Some(ov) => contains(ov, v, &p)?,
                    None => return Err(p),
                }
            }
            Ok(())
        }
        (Value::Array(o), Value::Array(i)) => {
            let mut at = 0;
            for (n, v) in i.iter().enumerate() {
                let found = (at..o.len()).find(|&j| contains(&o[j], v, "").is_ok());
                match found {
                    Some(j) => at = j + 1,
                    None => return Err(format!("{path}/{n}")),
                }
            }
            Ok(())
        }
        (o, i) if o == i => Ok(()),
        _ => Err(path.to_string()),
    }
}
