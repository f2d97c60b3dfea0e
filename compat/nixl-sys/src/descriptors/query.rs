//! Answers of [`crate::Agent::query_mem`].

use crate::{NixlError, Params};

/// One answer per queried descriptor: `None` where the storage does not exist.
#[derive(Debug, Default)]
pub struct QueryResponseList {
    pub(crate) items: Vec<Option<Params>>,
}

/// One answer of a [`QueryResponseList`].
#[derive(Debug)]
pub struct QueryResponse<'a> {
    list: &'a QueryResponseList,
    index: usize,
}

impl QueryResponseList {
    /// An empty list.
    pub fn new() -> Result<Self, NixlError> {
        Ok(Self::default())
    }

    /// The number of answers.
    pub fn len(&self) -> Result<usize, NixlError> {
        Ok(self.items.len())
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> Result<bool, NixlError> {
        Ok(self.items.is_empty())
    }

    /// The answer at `index` (`InvalidParam` past the end).
    pub fn get(&self, index: usize) -> Result<QueryResponse<'_>, NixlError> {
        if index >= self.items.len() {
            return Err(NixlError::InvalidParam);
        }
        Ok(QueryResponse { list: self, index })
    }

    /// The answers in order.
    pub fn iter(&self) -> Result<QueryResponseIterator<'_>, NixlError> {
        Ok(QueryResponseIterator {
            list: self,
            index: 0,
        })
    }
}

impl QueryResponse<'_> {
    /// Whether the storage exists.
    pub fn has_value(&self) -> Result<bool, NixlError> {
        Ok(self.list.items[self.index].is_some())
    }

    /// What the backend says of it (`size`), when it exists.
    pub fn get_params(&self) -> Result<Option<Params>, NixlError> {
        self.list.items[self.index]
            .as_ref()
            .map(Params::clone)
            .transpose()
    }
}

/// An iterator over a [`QueryResponseList`].
#[derive(Debug)]
pub struct QueryResponseIterator<'a> {
    list: &'a QueryResponseList,
    index: usize,
}

impl<'a> Iterator for QueryResponseIterator<'a> {
    type Item = QueryResponse<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.index >= self.list.items.len() {
            return None;
        }
        let r = QueryResponse {
            list: self.list,
            index: self.index,
        };
        self.index += 1;
        Some(r)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.list.items.len() - self.index;
        (n, Some(n))
    }
}

impl ExactSizeIterator for QueryResponseIterator<'_> {}
