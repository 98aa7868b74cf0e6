//! `upcc key`: the key that signs the results you compute (`generate`, `show`).

use upcc_model::error::{Error, Result};

use crate::cli::{KeyArgs, KeyCommand};
use crate::trust;

pub fn key(args: &KeyArgs) -> Result<i32> {
    match &args.command {
        KeyCommand::Generate { name, out, force } => {
            let path = out
                .clone()
                .or_else(trust::signing_key_path)
                .ok_or_else(|| {
                    Error::user("there is no default place for the key (no $HOME)").hint(
                        "give one: `upcc key generate --out PATH`, then UPCC_SIGNING_KEY=PATH",
                    )
                })?;
            if *force && path.exists() {
                fs_err::remove_file(&path)
                    .map_err(|e| Error::user(format!("cannot replace the key: {e}")))?;
            }
            let name = name.clone().unwrap_or_else(trust::default_key_name);
            let key = trust::write_new_key(&path, &name)?;
            println!("{}", key.public());
            eprintln!(
                "upcc: the secret key is in `{}` (only you can read it); the line above is its public key: colleagues and CI add it to `trust.keys` in their ~/.config/upcc/config.yaml (or $UPCC_TRUSTED_KEYS) to use the results you compute",
                path.display()
            );
            if out.is_some() && crate::env::signing_key().as_deref() != Some(path.as_path()) {
                eprintln!(
                    "upcc: to sign with it: export UPCC_SIGNING_KEY={}",
                    path.display()
                );
            }
            Ok(0)
        }
        KeyCommand::Show => {
            let path = trust::signing_key_path().ok_or_else(|| {
                Error::user("there is no signing key (no $HOME, no $UPCC_SIGNING_KEY)")
            })?;
            match trust::read_key(&path)? {
                Some(k) => {
                    println!("{}", k.public());
                    Ok(0)
                }
                None => Err(Error::user(format!(
                    "there is no signing key at `{}` yet",
                    path.display()
                ))
                .hint("`upcc key generate` makes one (a run that computes makes one too)")),
            }
        }
    }
}
