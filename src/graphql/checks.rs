//! What every GraphQL operation goes through, whatever the transport (HTTP or
//! WebSocket): before it runs, no argument or variable may hold a NUL character
//! ([`crate::domain::text`]), so a resolver never passes one to PostgreSQL; after, JSON
//! numbers are put back as numbers ([`ExactNumbers`]).

use std::sync::Arc;

use async_graphql::extensions::{Extension, ExtensionContext, ExtensionFactory, NextParseQuery};
use async_graphql::parser::types::{Directive, ExecutableDocument, Selection, SelectionSet};
use async_graphql::{Positioned, ServerResult, Value as ConstValue, Variables};

use crate::domain::text::nul_rejection;
use crate::error::Error;

/// The extension that refuses NUL characters with `TEXT-NUL`.
pub struct RefuseNul;

impl ExtensionFactory for RefuseNul {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(RefuseNul)
    }
}

#[async_graphql::async_trait::async_trait]
impl Extension for RefuseNul {
    async fn parse_query(
        &self,
        ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        for (name, v) in variables.iter() {
            if has_nul(v) {
                return Err(refused(&format!("variable `${name}`")));
            }
        }
        let doc = next.run(ctx, query, variables).await?;
        for (_, op) in doc.operations.iter() {
            let op = &op.node;
            if let Some(d) = &op
                .variable_definitions
                .iter()
                .find(|d| d.node.default_value.as_ref().is_some_and(|v| has_nul(&v.node)))
            {
                return Err(refused(&format!("the default of `${}`", d.node.name.node)));
            }
            check_directives(&op.directives)?;
            check_set(&op.selection_set.node)?;
        }
        for f in doc.fragments.values() {
            check_directives(&f.node.directives)?;
            check_set(&f.node.selection_set.node)?;
        }
        Ok(doc)
    }
}

fn refused(place: &str) -> async_graphql::ServerError {
    super::error::gql_error(&Error::Rejected(nul_rejection(place))).into_server_error(Default::default())
}

fn check_set(set: &SelectionSet) -> ServerResult<()> {
    for item in &set.items {
        match &item.node {
            Selection::Field(f) => {
                let f = &f.node;
                for (name, v) in &f.arguments {
                    if value_has_nul(&v.node) {
                        return Err(refused(&format!("argument `{}` of `{}`", name.node, f.name.node)));
                    }
                }
                check_directives(&f.directives)?;
                check_set(&f.selection_set.node)?;
            }
            Selection::FragmentSpread(s) => check_directives(&s.node.directives)?,
            Selection::InlineFragment(i) => {
                check_directives(&i.node.directives)?;
                check_set(&i.node.selection_set.node)?;
            }
        }
    }
    Ok(())
}

fn check_directives(directives: &[Positioned<Directive>]) -> ServerResult<()> {
    for d in directives {
        for (name, v) in &d.node.arguments {
            if value_has_nul(&v.node) {
                return Err(refused(&format!("argument `{}` of `@{}`", name.node, d.node.name.node)));
            }
        }
    }
    Ok(())
}

/// A literal argument; variables in it are checked on their own.
fn value_has_nul(v: &async_graphql_value::Value) -> bool {
    use async_graphql_value::Value;
    match v {
        Value::String(s) => s.contains('\0'),
        Value::List(items) => items.iter().any(value_has_nul),
        Value::Object(map) => map.iter().any(|(k, x)| k.contains('\0') || value_has_nul(x)),
        _ => false,
    }
}

fn has_nul(v: &ConstValue) -> bool {
    match v {
        ConstValue::String(s) => s.contains('\0'),
        ConstValue::List(items) => items.iter().any(has_nul),
        ConstValue::Object(map) => map.iter().any(|(k, x)| k.contains('\0') || has_nul(x)),
        _ => false,
    }
}

/// The extension that gives JSON numbers back as they are stored.
///
/// With serde_json's `arbitrary_precision` (numbers kept as their exact text), a
/// `serde_json::Number` serialises as a one-field struct that only serde_json's own
/// serialiser understands; async-graphql's value serialiser turns it into the object
/// `{"$serde_json::private::Number": "1.5"}`. This puts the number back in every
/// response (queries, mutations and each item of a subscription).
pub struct ExactNumbers;

impl ExtensionFactory for ExactNumbers {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(ExactNumbers)
    }
}

#[async_graphql::async_trait::async_trait]
impl Extension for ExactNumbers {
    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: async_graphql::extensions::NextExecute<'_>,
    ) -> async_graphql::Response {
        let mut r = next.run(ctx, operation_name).await;
        exact_numbers(&mut r.data);
        r
    }

    fn subscribe<'s>(
        &self,
        ctx: &ExtensionContext<'_>,
        stream: futures::stream::BoxStream<'s, async_graphql::Response>,
        next: async_graphql::extensions::NextSubscribe<'_>,
    ) -> futures::stream::BoxStream<'s, async_graphql::Response> {
        use futures::StreamExt;
        next.run(ctx, stream)
            .map(|mut r| {
                exact_numbers(&mut r.data);
                r
            })
            .boxed()
    }
}

/// serde_json's name for the field of a number serialised under `arbitrary_precision`.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// Turns every `{"$serde_json::private::Number": "<text>"}` back into the number.
fn exact_numbers(v: &mut ConstValue) {
    match v {
        ConstValue::List(items) => items.iter_mut().for_each(exact_numbers),
        ConstValue::Object(map) => {
            if map.len() == 1 {
                if let Some(ConstValue::String(text)) = map.get(NUMBER_TOKEN) {
                    if let Ok(n) = serde_json::from_str::<serde_json::Number>(text) {
                        *v = ConstValue::Number(n);
                        return;
                    }
                }
            }
            map.values_mut().for_each(exact_numbers);
        }
        _ => {}
    }
}
