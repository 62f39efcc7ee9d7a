//! The spec a timed try reverts to (`apply::try_window`): `tries/<id>.pb`, the NodeSpec
//! applied before the try, sealed with its checksum like the applied spec, 0600 (it
//! holds file content). Written before the try's first change, removed when the try is
//! confirmed or reverted.

use super::journal::{SEAL, seal, unseal};
use super::{StateDir, StateError};
use inplace_wire::pb;

fn rel(id: &str) -> String {
    format!("/tries/{id}.pb")
}

impl StateDir {
    /// Saves `spec` (protobuf bytes) as what the try `id` reverts to; durable.
    pub fn save_try_base(&self, id: &str, spec: &[u8]) -> Result<(), StateError> {
        self.write(&rel(id), &seal(spec))
    }

    /// The spec the try `id` reverts to; None when none was saved. A file that does not
    /// verify is [`StateError::Corrupt`].
    pub fn load_try_base(&self, id: &str) -> Result<Option<pb::NodeSpec>, StateError> {
        let r = rel(id);
        let Some(b) = self.io(self.dir.read(&r))? else {
            return Ok(None);
        };
        if !b.starts_with(SEAL.as_bytes()) {
            return Err(self.corrupt(&r, "no checksum header"));
        }
        let body = unseal(&b).map_err(|e| self.corrupt(&r, e))?;
        <pb::NodeSpec as prost::Message>::decode(body)
            .map(Some)
            .map_err(|e| self.corrupt(&r, e))
    }

    /// Removes the saved spec of the try `id` (absent is fine).
    pub fn drop_try_base(&self, id: &str) -> Result<(), StateError> {
        self.io(self.dir.remove(&rel(id)))?;
        Ok(())
    }
}
