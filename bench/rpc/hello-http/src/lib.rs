//! Answers every request with 200 and the body `hello`.

use wasi::http::types::{Fields, IncomingRequest, OutgoingBody, OutgoingResponse, ResponseOutparam};

struct Hello;

impl wasi::exports::http::incoming_handler::Guest for Hello {
    fn handle(_request: IncomingRequest, response_out: ResponseOutparam) {
        let headers = Fields::from_list(&[("content-type".to_string(), b"text/plain".to_vec())])
            .expect("valid header");
        let response = OutgoingResponse::new(headers);
        let body = response.body().expect("body taken once");
        ResponseOutparam::set(response_out, Ok(response));
        let out = body.write().expect("stream taken once");
        out.blocking_write_and_flush(b"hello").expect("write body");
        drop(out);
        OutgoingBody::finish(body, None).expect("finish body");
    }
}

wasi::http::proxy::export!(Hello);
