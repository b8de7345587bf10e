//! Subscription root. Live operations read through the same [`Tail`] as SSE.

use async_graphql::{Context, Subscription, ID};
use futures::{Stream, StreamExt};

use super::error::GqlResult;
use super::schema::{app, caller, GqlEvent};
use crate::live::Tail;

/// Live operations (WebSocket at `/graphql/ws`, graphql-transport-ws or the legacy
/// subscriptions-transport-ws; the API key goes in `connection_init`).
pub struct Subscription;

#[Subscription]
impl Subscription {
    /// The run's events after `afterSeq` (default 0), then each new one as it commits;
    /// completes after the run's terminal lifecycle event. Resume with the last `seq`
    /// received as `afterSeq`.
    async fn run_events(
        &self,
        ctx: &Context<'_>,
        run_id: ID,
        after_seq: Option<i64>,
        #[graphql(desc = "Only these event types.")] types: Option<Vec<String>>,
        #[graphql(desc = "Only this child's events.")] child_id: Option<String>,
    ) -> async_graphql::Result<impl Stream<Item = GqlEvent>> {
        let app = app(ctx)?.clone();
        let who = caller(ctx)?.clone();
        let after = after_seq.unwrap_or(0);
        if after < 0 {
            return Err(crate::error::Error::reject(
                crate::error::ErrorCode::InvalidParameter,
                "`afterSeq` must be 0 or more",
            ))
            .gql();
        }
        let run = app.run(&who, &run_id).await.gql()?;
        let tail = Tail::new(app, who, run.run_id, after);
        let events =
            futures::stream::unfold(tail, |mut t| async move { t.next_batch().await.map(|b| (b, t)) })
                .flat_map(futures::stream::iter)
                .filter(move |e| {
                    let keep = types.as_ref().is_none_or(|ts| ts.iter().any(|t| *t == e.body.type_name()))
                        && child_id.as_ref().is_none_or(|c| e.child_id.as_ref() == Some(c));
                    futures::future::ready(keep)
                })
                .map(GqlEvent::from);
        Ok(events)
    }
}
