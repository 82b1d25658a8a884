//! The peer transport's frame decoding: any bytes either fail with a `DecodeError` or
//! decode to a message (or envelope) that encodes and decodes back to itself; the
//! length check never claims more than `MAX_FRAME_LEN`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenure_peer::wire;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(len)) = wire::frame_len(data) {
        assert!(len <= wire::MAX_FRAME_LEN && len <= data.len());
    }
    if let Ok(msg) = wire::decode(data) {
        let again = wire::encode(&msg).expect("a decoded message encodes");
        assert_eq!(wire::decode(&again).expect("and decodes"), msg);
        let _ = msg.kind();
    }
    if let Ok(envelope) = wire::decode_envelope(data) {
        let again = wire::encode_envelope(&envelope).expect("a decoded envelope encodes");
        assert_eq!(wire::decode_envelope(&again).expect("and decodes"), envelope);
    }
    if let Err(e) = wire::decode(data) {
        let _ = e.label();
    }
});
