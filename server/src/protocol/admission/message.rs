//! Step 3, then: the request message, whole, within `request_wait` of the call's headers and within
//! its method's size (`limits::request_bytes`), so a call whose client sends its headers and nothing
//! more ends, and no call holds more memory than its method allows.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use tonic::Status;
use tonic::body::Body;
use tower::ServiceExt;

use super::{Job, Next, Refusal};
use crate::domain::limits;

#[derive(Clone)]
pub struct WholeMessage {
    pub(super) wait: Duration,
    pub(super) upload_bytes: usize,
}

/// The slowest an upload may come: a second more for each MiB of the largest file.
const UPLOAD_BYTES_A_SECOND: usize = 1024 * 1024;

impl Job for WholeMessage {
    async fn admit<S: Next>(&self, request: Request<Body>, next: S) -> Result<Response<Body>, Refusal> {
        let (max, wait) = if limits::is_upload(request.uri().path()) {
            let extra = Duration::from_secs(self.upload_bytes.div_ceil(UPLOAD_BYTES_A_SECOND) as u64);
            (self.upload_bytes + limits::REQUEST_FRAME_BYTES, self.wait + extra)
        } else {
            (limits::request_bytes(request.uri().path()), self.wait)
        };
        let (parts, body) = request.into_parts();
        let message = read_message(body, wait, max).await?;
        let request = Request::from_parts(parts, Body::new(http_body_util::Full::new(message)));
        next.oneshot(request).await.map_err(|e| Refusal::Failed(e.into()))
    }
}

/// The request's message, whole: at most `max` bytes, all of it within `wait`.
async fn read_message(body: Body, wait: Duration, max: usize) -> Result<Bytes, Refusal> {
    let read = http_body_util::Limited::new(body, max).collect();
    match tokio::time::timeout(wait, read).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(Status::invalid_argument(format!(
            "the request is larger than the {max} bytes this method takes: nothing was done"
        ))
        .into()),
        // The client reset the call or went away while sending it: nobody is there to answer.
        Ok(Err(e)) => Err(Refusal::Failed(e)),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "the request message did not arrive within {} s of the call's headers: nothing was done",
            wait.as_secs_f64()
        ))
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tonic::Code;

    use super::super::testing::*;
    use super::super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_whose_message_never_comes_ends_and_holds_no_place_of_its_account() {
        let service = admission(answering(), RpcLimits { per_account: 1, ..RpcLimits::default() });
        let headers_only = call_from("/relay.v1.Relay/Send", "Bearer 1:1", "10.0.0.1:5000", Body::new(Never));
        let half_open = tokio::spawn(service.clone().oneshot(headers_only));
        tokio::task::yield_now().await;
        // Meanwhile another agent of the same account works.
        let other = service.clone().oneshot(call("/relay.v1.Relay/Send", 1, 2)).await.unwrap();
        assert_eq!(status_of(&other), Code::Ok);
        let started = tokio::time::Instant::now();
        let ended = half_open.await.unwrap().unwrap();
        assert_eq!(status_of(&ended), Code::DeadlineExceeded);
        assert!(
            message_of(&ended).starts_with("the request message did not arrive within 5 s"),
            "{}",
            message_of(&ended)
        );
        assert!(started.elapsed() <= DEFAULT_REQUEST_WAIT);
    }

    #[tokio::test]
    async fn a_request_larger_than_its_method_takes_is_refused_unread() {
        let service = admission(answering(), RpcLimits::default());
        let big = Body::new(http_body_util::Full::new(Bytes::from(vec![0u8; 20 * 1024])));
        let refused = service
            .clone()
            .oneshot(call_from("/relay.v1.Relay/Confirm", "Bearer 1:1", "10.0.0.1:1", big))
            .await
            .unwrap();
        assert_eq!(status_of(&refused), Code::InvalidArgument);
        assert_eq!(
            message_of(&refused),
            "the request is larger than the 16384 bytes this method takes: nothing was done"
        );
        let body = Body::new(http_body_util::Full::new(Bytes::from(vec![0u8; 20 * 1024])));
        let send = service.oneshot(call_from("/relay.v1.Relay/Send", "Bearer 1:1", "10.0.0.1:1", body)).await.unwrap();
        assert_eq!(status_of(&send), Code::Ok, "a send may carry a 64 KiB body");
    }
}
