//! `crius.v1.Pulls`: pull progress for the CLI's progress bar.

use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::proto::{PullProgress, WatchRequest, pulls_server};
use crate::image::ImageService;

const TICK: Duration = Duration::from_millis(100);

pub struct Pulls {
    images: ImageService,
}

impl Pulls {
    pub fn new(images: ImageService) -> Pulls {
        Pulls { images }
    }
}

#[tonic::async_trait]
impl pulls_server::Pulls for Pulls {
    type WatchStream = Pin<Box<dyn Stream<Item = Result<PullProgress, Status>> + Send>>;

    async fn watch(
        &self,
        req: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let req = req.into_inner();
        crate::image::Reference::parse(&req.image).map_err(crate::image::Error::from)?;
        let images = self.images.clone();
        let wait = Duration::from_secs(req.wait_seconds.min(600).into());
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let start = Instant::now();
            let progress = loop {
                if let Some(p) = images.progress(&req.image) {
                    break p;
                }
                if start.elapsed() >= wait {
                    return;
                }
                tokio::time::sleep(TICK).await;
            };
            loop {
                let s = progress.snapshot();
                let msg = PullProgress {
                    layers_total: s.layers_total,
                    layers_done: s.layers_done,
                    bytes_total: s.bytes_total,
                    bytes_done: s.bytes_done,
                    done: s.done,
                    error: s.error.unwrap_or_default(),
                };
                if tx.send(Ok(msg)).await.is_err() || s.done {
                    return;
                }
                tokio::time::sleep(TICK).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
