//! String parameters and string lists (nixl-sys's `utils`).

use std::collections::HashMap;

use crate::{NixlError, ParamMap};

/// Backend parameters: string keys and values.
#[derive(Debug, Default)]
pub struct Params {
    pub(crate) map: ParamMap,
}

/// A key and its value.
#[derive(Debug)]
pub struct ParamPair<'a> {
    /// The key.
    pub key: &'a str,
    /// The value.
    pub value: &'a str,
}

/// An iterator over a [`Params`]' pairs.
#[derive(Debug)]
pub struct ParamIterator<'a> {
    iter: std::collections::btree_map::Iter<'a, String, String>,
}

/// The pairs of `&Params`, without the `Result` (`for (k, v) in &params`).
#[derive(Debug)]
pub struct ParamIntoIter<'a> {
    inner: ParamIterator<'a>,
}

impl<'a> Iterator for ParamIntoIter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.find_map(Result::ok)
    }
}

impl<'a> Iterator for ParamIterator<'a> {
    type Item = Result<(&'a str, &'a str), NixlError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.iter.next().map(|(k, v)| Ok((k.as_str(), v.as_str())))
    }
}

impl From<ParamIterator<'_>> for HashMap<String, String> {
    fn from(iter: ParamIterator<'_>) -> Self {
        iter.filter_map(Result::ok)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

impl<'a> IntoIterator for &'a Params {
    type Item = (&'a str, &'a str);
    type IntoIter = ParamIntoIter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        ParamIntoIter {
            inner: ParamIterator {
                iter: self.map.iter(),
            },
        }
    }
}

impl Params {
    pub(crate) fn from_map(map: ParamMap) -> Self {
        Params { map }
    }

    /// Parameters from key-value pairs (`StringConversionError` for a NUL byte).
    pub fn from<I, K, V>(iter: I) -> Result<Self, NixlError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut params = Params::default();
        for (key, value) in iter {
            params.set(key.as_ref(), value.as_ref())?;
        }
        Ok(params)
    }

    /// A copy.
    pub fn clone(&self) -> Result<Self, NixlError> {
        Ok(Params {
            map: self.map.clone(),
        })
    }

    /// Sets `key` to `value` (`StringConversionError` for a NUL byte in either).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), NixlError> {
        std::ffi::CString::new(key)?;
        std::ffi::CString::new(value)?;
        self.map.insert(key.to_owned(), value.to_owned());
        Ok(())
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> Result<bool, NixlError> {
        Ok(self.map.is_empty())
    }

    /// The pairs, ordered by key.
    pub fn iter(&self) -> Result<ParamIterator<'_>, NixlError> {
        Ok(ParamIterator {
            iter: self.map.iter(),
        })
    }
}

/// A list of strings (plugin names).
#[derive(Debug, Default)]
pub struct StringList {
    items: Vec<String>,
}

impl StringList {
    pub(crate) fn new(items: Vec<String>) -> Self {
        StringList { items }
    }

    /// The number of strings.
    pub fn len(&self) -> Result<usize, NixlError> {
        Ok(self.items.len())
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> Result<bool, NixlError> {
        Ok(self.items.is_empty())
    }

    /// The string at `index` (`InvalidParam` past the end).
    pub fn get(&self, index: usize) -> Result<&str, NixlError> {
        self.items
            .get(index)
            .map(String::as_str)
            .ok_or(NixlError::InvalidParam)
    }

    /// The strings in order.
    pub fn iter(&self) -> StringListIterator<'_> {
        StringListIterator {
            list: self,
            index: 0,
        }
    }
}

/// An iterator over a [`StringList`].
#[derive(Debug)]
pub struct StringListIterator<'a> {
    list: &'a StringList,
    index: usize,
}

impl<'a> Iterator for StringListIterator<'a> {
    type Item = Result<&'a str, NixlError>;

    fn next(&mut self) -> Option<Self::Item> {
        let s = self.list.items.get(self.index)?;
        self.index += 1;
        Some(Ok(s.as_str()))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.list.items.len() - self.index;
        (n, Some(n))
    }
}
