//! Our errors in GraphQL's shape: `message`, plus `extensions.code` (the same stable
//! code the HTTP API uses) and `extensions.index` for the offending event.

use async_graphql::ErrorExtensions;

use crate::error::{Error, Rejection};

impl ErrorExtensions for Error {
    fn extend(&self) -> async_graphql::Error {
        let code = self.code();
        let (message, index) = self.public_parts();
        async_graphql::Error::new(message).extend_with(|_, e| {
            e.set("code", code.as_str());
            if let Some(i) = index {
                e.set("index", i as u64);
            }
        })
    }
}

impl ErrorExtensions for Rejection {
    fn extend(&self) -> async_graphql::Error {
        Error::Rejected(self.clone()).extend()
    }
}

/// `.gql()?` turns a library result into a resolver result.
pub trait GqlResult<T> {
    /// Maps the error into GraphQL's shape.
    fn gql(self) -> async_graphql::Result<T>;
}

impl<T> GqlResult<T> for Result<T, Error> {
    fn gql(self) -> async_graphql::Result<T> {
        self.map_err(|e| e.extend())
    }
}
