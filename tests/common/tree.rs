//! Directory tree copies (shared with `benches/agent.rs`).

use std::path::Path;

/// Copies a directory tree, making every copy writable by its owner.
pub(crate) fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let ft = e.file_type().unwrap();
        let dst = to.join(e.file_name());
        if ft.is_dir() {
            copy_tree(&e.path(), &dst);
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path()).unwrap(), &dst).unwrap();
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
            use std::os::unix::fs::PermissionsExt;
            let mut p = std::fs::metadata(&dst).unwrap().permissions();
            p.set_mode(p.mode() | 0o200);
            std::fs::set_permissions(&dst, p).unwrap();
        }
    }
}
