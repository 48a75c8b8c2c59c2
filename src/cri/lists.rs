//! List streaming (KEP-5825, `Stream*` calls): a listing sent as a stream of messages, each of at
//! least one item and under a size budget, so a node with more than fits one message (gRPC's
//! 16 MiB) lists whole. An empty listing is the stream's end alone.

use std::pin::Pin;

use tokio_stream::Stream;
use tonic::Status;

/// Each message of a streamed listing holds items up to about this many encoded bytes (a
/// single larger item goes alone): well under a client's default limit of 4 MiB.
pub const CHUNK_BYTES: usize = 2 << 20;

pub type Listing<R> = Pin<Box<dyn Stream<Item = Result<R, Status>> + Send>>;

/// `items` split into messages made by `wrap`.
pub fn chunked<T, R>(items: Vec<T>, wrap: impl Fn(Vec<T>) -> R + Send + 'static) -> Listing<R>
where
    T: prost::Message + Send + 'static,
    R: Send + 'static,
{
    let mut chunks = Vec::new();
    let mut current = Vec::new();
    let mut size = 0;
    for item in items {
        // The item's bytes and its field tag and length.
        let n = item.encoded_len() + 8;
        if !current.is_empty() && size + n > CHUNK_BYTES {
            chunks.push(std::mem::take(&mut current));
            size = 0;
        }
        size += n;
        current.push(item);
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    Box::pin(tokio_stream::iter(
        chunks.into_iter().map(move |c| Ok(wrap(c))),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::v1 as cri;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn every_item_once_in_messages_under_the_budget() {
        let big = "x".repeat(1 << 20);
        let items: Vec<cri::Container> = (0..20)
            .map(|i| cri::Container {
                id: format!("{i}"),
                labels: [("l".to_string(), big.clone())].into(),
                ..Default::default()
            })
            .collect();
        let mut s = chunked(items, |containers| cri::StreamContainersResponse {
            containers,
        });
        let mut seen = Vec::new();
        let mut messages = 0;
        while let Some(m) = s.next().await {
            let m = m.unwrap();
            assert!(!m.containers.is_empty());
            assert!(prost::Message::encoded_len(&m) <= CHUNK_BYTES + (1 << 20) + 64);
            seen.extend(m.containers.into_iter().map(|c| c.id));
            messages += 1;
        }
        assert_eq!(seen, (0..20).map(|i| i.to_string()).collect::<Vec<_>>());
        assert!(messages >= 10, "{messages}");
        let mut empty = chunked(Vec::<cri::Container>::new(), |containers| {
            cri::StreamContainersResponse { containers }
        });
        assert!(empty.next().await.is_none());
    }
}
