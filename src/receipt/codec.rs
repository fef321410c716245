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
