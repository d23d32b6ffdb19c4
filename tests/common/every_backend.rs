//! `every_backend!`, the one way to run a test on every backend, and what it runs on.

use std::future::Future;

use super::{Backend, TestServer};

/// What a test run on one backend is given: a server started with the default options,
/// or the backend itself (the test starts what it needs).
pub trait OnBackend: Sized {
    fn on(backend: Backend) -> impl Future<Output = Option<Self>>;
}

impl OnBackend for TestServer {
    async fn on(backend: Backend) -> Option<TestServer> {
        TestServer::start(backend).await
    }
}

impl OnBackend for Backend {
    async fn on(backend: Backend) -> Option<Backend> {
        Some(backend)
    }
}

/// Run `test` on `backend`; without PostgreSQL outside CI it does not run (with a note,
/// from `fresh_database`); on CI that fails.
pub async fn run_on<T: OnBackend, Fut: Future<Output = ()>>(
    backend: Backend,
    test: impl FnOnce(T) -> Fut,
) {
    if let Some(arg) = T::on(backend).await {
        test(arg).await
    }
}

/// The one way to run a test on every backend: each `async fn name(srv: TestServer)` or
/// `async fn name(backend: Backend)` written inside it (or, for functions written outside,
/// each name listed: `every_backend!(a, b)`) becomes the tests `name::sqlite` and
/// `name::postgres`. A test that compares the backends with each other (the seeded
/// simulation, the drills' report) runs them in turn over `Backend::ALL`.
#[macro_export]
macro_rules! every_backend {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    $crate::common::run_on($crate::common::Backend::Sqlite, super::$name).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    $crate::common::run_on($crate::common::Backend::Postgres, super::$name).await
                }
            }
        )+
    };
    ($(async fn $name:ident($arg:ident : $ty:ty) $body:block)*) => {
        $(
            #[allow(unused_mut)]
            async fn $name(mut $arg: $ty) $body
        )*
        $crate::every_backend!($($name),*);
    };
}
