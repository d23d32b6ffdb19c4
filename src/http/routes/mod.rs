//! The routes, one file a resource. Each handler extracts, checks access, calls one
//! service or store function, and answers; errors map to the format in `http::error`.

pub mod admissions;
pub mod audit;
pub mod auto_topup;
pub mod console;
pub mod exports;
pub mod grants;
pub mod heartbeats;
pub mod limits;
pub mod me;
pub mod notifications;
pub mod ops;
pub mod orgs;
pub mod overage;
pub mod plans;
pub mod sessions;
pub mod stripe;
pub mod tokens;
pub mod topups;
pub mod usage;
