use crate::error::BoxError;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// How a result is stored as a receipt and read back.
///
/// ```
/// use stormguard::error::BoxError;
/// use stormguard::receipt::Codec;
///
/// /// A provider's message id, stored as its bytes.
/// #[derive(Clone)]
/// struct MessageId;
/// impl Codec<String> for MessageId {
///     fn encode(&self, res: &String) -> Result<Vec<u8>, BoxError> { Ok(res.clone().into_bytes()) }
///     fn decode(&self, bytes: &[u8]) -> Result<String, BoxError> { Ok(String::from_utf8(bytes.to_vec())?) }
/// }
/// let bytes = MessageId.encode(&"msg-4471".to_string()).unwrap();
/// assert_eq!(MessageId.decode(&bytes).unwrap(), "msg-4471");
/// assert!(MessageId.decode(&[0xff]).is_err());
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot store a `{Res}` as a receipt",
    label = "this codec does not know `{Res}`",
    note = "the default `JsonCodec` stores a `serde` type; for an `http::Response` with a body in memory give the layer `.codec(HttpCodec)`; for anything else implement `Codec<{Res}>`"
)]
pub trait Codec<Res>: Clone + Send + Sync + 'static {
    /// The bytes to store.
    fn encode(&self, res: &Res) -> Result<Vec<u8>, BoxError>;
    /// The result the bytes stand for.
    fn decode(&self, bytes: &[u8]) -> Result<Res, BoxError>;
    /// Whether it stores results at all (`true`; [`NotStored`] says `false`).
    fn stores(&self) -> bool {
        true
    }
}

/// For a response that is never stored as a receipt: a streamed answer (a body of tokens, a
/// gRPC stream), which the receipt layer hands on before its end. Give it to
/// [`ReceiptGuardLayer::codec`](super::ReceiptGuardLayer::codec) over such a service, whose response no
/// codec could store: the layer still records the intent and stamps the key, so a repeat is
/// resumed with the same key (or escalated, by class), and a success leaves the intent pending,
/// its lease given up, as any streamed answer does.
///
/// ```
/// use stormguard::receipt::{Codec, NotStored};
///
/// struct TokenStream; // not serialisable: it arrives over time
/// assert!(!Codec::<TokenStream>::stores(&NotStored));
/// assert!(NotStored.encode(&TokenStream).is_err());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct NotStored;

impl<Res> Codec<Res> for NotStored {
    fn encode(&self, _: &Res) -> Result<Vec<u8>, BoxError> {
        Err("a streamed response is not stored as a receipt".into())
    }

    fn decode(&self, _: &[u8]) -> Result<Res, BoxError> {
        Err("the action completed, but its answer was streamed and is not stored".into())
    }

    fn stores(&self) -> bool {
        false
    }
}

/// Stores results as JSON (serde).
///
/// ```
/// use stormguard::receipt::{Codec, JsonCodec};
/// let bytes = JsonCodec.encode(&vec![1, 2]).unwrap();
/// assert_eq!(Codec::<Vec<i32>>::decode(&JsonCodec, &bytes).unwrap(), vec![1, 2]);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonCodec;

impl<Res: Serialize + DeserializeOwned> Codec<Res> for JsonCodec {
    fn encode(&self, res: &Res) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(res)?)
    }

    fn decode(&self, bytes: &[u8]) -> Result<Res, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// Stores an `http::Response` whose body is held in memory (`String`, `Vec<u8>`, `Bytes`):
/// status, headers and body (feature `http`). A streamed body is not stored: read it into one of
/// these first (for reqwest, `http::Response::from` then collect the body, or keep what the tool
/// returns, not the raw response).
///
/// ```
/// use stormguard::receipt::{Codec, HttpCodec};
///
/// let resp = http::Response::builder().status(201).header("x-message-id", "msg-4471").body("sent".to_string()).unwrap();
/// let bytes = HttpCodec.encode(&resp).unwrap();
/// let back: http::Response<String> = HttpCodec.decode(&bytes).unwrap();
/// assert_eq!((back.status().as_u16(), back.body().as_str()), (201, "sent"));
/// assert_eq!(back.headers()["x-message-id"], "msg-4471");
/// ```
#[cfg(feature = "http")]
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpCodec;

/// A response body [`HttpCodec`] can store: held in memory as bytes.
#[cfg(feature = "http")]
pub trait StoredBody: Sized {
    /// The body's bytes.
    fn to_bytes(&self) -> Vec<u8>;
    /// The body from its bytes.
    fn from_bytes(bytes: Vec<u8>) -> Result<Self, BoxError>;
}

#[cfg(feature = "http")]
impl StoredBody for String {
    fn to_bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
    fn from_bytes(bytes: Vec<u8>) -> Result<Self, BoxError> {
        Ok(String::from_utf8(bytes)?)
    }
}

#[cfg(feature = "http")]
impl StoredBody for Vec<u8> {
    fn to_bytes(&self) -> Vec<u8> {
        self.clone()
    }
    fn from_bytes(bytes: Vec<u8>) -> Result<Self, BoxError> {
        Ok(bytes)
    }
}

#[cfg(feature = "http")]
impl StoredBody for bytes::Bytes {
    fn to_bytes(&self) -> Vec<u8> {
        self.to_vec()
    }
    fn from_bytes(bytes: Vec<u8>) -> Result<Self, BoxError> {
        Ok(bytes.into())
    }
}

#[cfg(feature = "http")]
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredResponse {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

#[cfg(feature = "http")]
impl<B: StoredBody> Codec<http::Response<B>> for HttpCodec {
    fn encode(&self, res: &http::Response<B>) -> Result<Vec<u8>, BoxError> {
        let stored = StoredResponse {
            status: res.status().as_u16(),
            headers: res
                .headers()
                .iter()
                .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
                .collect(),
            body: res.body().to_bytes(),
        };
        Ok(serde_json::to_vec(&stored)?)
    }

    fn decode(&self, bytes: &[u8]) -> Result<http::Response<B>, BoxError> {
        let stored: StoredResponse = serde_json::from_slice(bytes)?;
        let mut builder = http::Response::builder().status(stored.status);
        for (name, value) in stored.headers {
            builder = builder.header(name, value);
        }
        Ok(builder.body(B::from_bytes(stored.body)?)?)
    }
}
