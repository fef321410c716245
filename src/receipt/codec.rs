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
/// [`ReceiptLayer::codec`](super::ReceiptLayer::codec) over such a service, whose response no
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
