//! The strings of the API objects the guard decodes, borrowed from the body they come in.

use std::{borrow::Cow, fmt, marker::PhantomData, ops::Deref};

use serde::{Deserialize, Deserializer, de};

/// A JSON string of the body: borrowed from it, or unescaped into a copy when its JSON
/// text has escapes.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Text<'a>(pub Cow<'a, str>);

// === impl Text ===

impl Deref for Text<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<'a>(PhantomData<&'a ()>);

        impl<'de: 'a, 'a> de::Visitor<'de> for Visitor<'a> {
            type Value = Text<'a>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E: de::Error>(self, value: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(value)))
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(value.to_owned())))
            }

            fn visit_string<E: de::Error>(self, value: String) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(value)))
            }
        }

        deserializer.deserialize_str(Visitor(PhantomData))
    }
}
