//! Our errors in GraphQL's shape: `message`, plus `extensions.code` (the same stable
//! code the HTTP API uses) and `extensions.index` for the offending event.

use crate::error::{Error, Rejection};

/// The GraphQL error for `e`: the one mapping from our errors to GraphQL's shape.
pub fn gql_error(e: &Error) -> async_graphql::Error {
    use async_graphql::ErrorExtensions;
    let code = e.code();
    let (message, index) = e.public_parts();
    async_graphql::Error::new(message).extend_with(|_, x| {
        x.set("code", code.as_str());
        if let Some(kai) = code.kai_code() {
            x.set("kai_code", kai);
        }
        if let Some(i) = index {
            x.set("index", i as u64);
        }
    })
}

/// `.gql()?` turns a library result into a resolver result.
pub trait GqlResult<T> {
    /// Maps the error into GraphQL's shape.
    fn gql(self) -> async_graphql::Result<T>;
}

impl<T> GqlResult<T> for Result<T, Error> {
    fn gql(self) -> async_graphql::Result<T> {
        self.map_err(|e| gql_error(&e))
    }
}

impl<T> GqlResult<T> for Result<T, Rejection> {
    fn gql(self) -> async_graphql::Result<T> {
        self.map_err(|r| gql_error(&Error::Rejected(r)))
    }
}
