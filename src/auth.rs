//! API tokens and roles.
//!
//! Owns token generation (256 random bits, shown once), hashing (only a SHA-256 hash is stored:
//! tokens are random, so a slow password hash adds nothing) and the role rules the service
//! checks. Must not log a token or read the database itself.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Everything.
    Admin,
    /// Submit jobs; read and cancel its own.
    User,
    /// One site's inventory, heartbeats, directives and events.
    Agent,
    /// Read plans, jobs, sites and reports; write nothing.
    Viewer,
}

impl Role {
    /// The stored and command-line name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
            Role::Agent => "agent",
            Role::Viewer => "viewer",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "admin" => Ok(Role::Admin),
            "user" => Ok(Role::User),
            "agent" => Ok(Role::Agent),
            "viewer" => Ok(Role::Viewer),
            other => Err(format!(
                "unknown role `{other}`: use admin, user, agent or viewer"
            )),
        }
    }
}

/// The holder of a valid token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// Token holder's name (jobs a user submits are owned by it).
    pub name: String,
    pub role: Role,
    /// The site an agent token is bound to.
    pub site: Option<String>,
}

impl Principal {
    /// Whether this principal may act for `site` as its agent (admins may act for any site).
    pub fn may_act_for_site(&self, site: &str) -> bool {
        match self.role {
            Role::Admin => true,
            Role::Agent => self.site.as_deref() == Some(site),
            Role::User | Role::Viewer => false,
        }
    }

    /// Whether this principal may read or change a job owned by `owner`.
    pub fn may_touch_job(&self, owner: Option<&str>) -> bool {
        match self.role {
            Role::Admin => true,
            Role::User => owner == Some(self.name.as_str()),
            Role::Agent | Role::Viewer => false,
        }
    }
}

/// A new token: the secret to show once, its public id and the hash to store.
pub struct NewToken {
    pub token: String,
    pub id: String,
    pub hash: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Generates a token `wf_<id>_<secret>` from the operating system's random source.
pub fn new_token() -> Result<NewToken, getrandom::Error> {
    let mut id = [0u8; 4];
    let mut secret = [0u8; 32];
    getrandom::fill(&mut id)?;
    getrandom::fill(&mut secret)?;
    let id = hex(&id);
    let token = format!("wf_{id}_{}", hex(&secret));
    Ok(NewToken {
        hash: hash_token(&token),
        token,
        id,
    })
}

/// The stored form of a token.
pub fn hash_token(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_and_hash_stably() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_ne!(a.token, b.token);
        assert_eq!(a.hash, hash_token(&a.token));
        assert_eq!(a.hash.len(), 64);
        assert!(a.token.starts_with(&format!("wf_{}_", a.id)));
    }

    #[test]
    fn scopes() {
        let agent = Principal {
            name: "agent-a".into(),
            role: Role::Agent,
            site: Some("a".into()),
        };
        assert!(agent.may_act_for_site("a"));
        assert!(!agent.may_act_for_site("b"));
        assert!(!agent.may_touch_job(Some("agent-a")));
        let alice = Principal {
            name: "alice".into(),
            role: Role::User,
            site: None,
        };
        assert!(alice.may_touch_job(Some("alice")));
        assert!(!alice.may_touch_job(Some("bob")));
        assert!(!alice.may_touch_job(None));
        assert_eq!("viewer".parse::<Role>(), Ok(Role::Viewer));
        assert!("root".parse::<Role>().is_err());
    }
}
