//! The shared library's versioned name: `libtensormalloc.so.0` (its DT_SONAME), so a program
//! linked with `-ltensormalloc` records the major version it was built against, while the file
//! cargo writes, and the name users preload, stays `libtensormalloc.so`. Beside it in the build
//! directory, a `libtensormalloc.so.0` link to it, so programs linked from the build tree find it
//! by that name (scripts/install lays out the same two names). The library is marked never to
//! be unloaded.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    let soname = format!("libtensormalloc.so.{major}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    // Never unloaded (DF_1_NODELETE): our background thread runs the library's code, and the
    // blocks we handed out are recorded in its memory; a dlclose of the last handle (a program
    // that dlopened the API, a plugin linked against us) unmapped both, and the thread faulted.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
    // OUT_DIR is <target>[/<triple>]/<profile>/build/<package>-<hash>/out.
    if let Some(profile_dir) = std::env::var_os("OUT_DIR").as_ref().map(std::path::Path::new).and_then(|p| p.ancestors().nth(3)) {
        let link = profile_dir.join(&soname);
        if std::fs::symlink_metadata(&link).is_err() {
            let _ = std::os::unix::fs::symlink("libtensormalloc.so", &link);
        }
    }
}
