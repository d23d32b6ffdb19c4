// Sign a Stripe webhook payload (read from stdin) with Stripe's own Node library, as
// Stripe signs the events it sends: `sign.js <secret> <unix time>` prints the
// Stripe-Signature header. Used by tests/stripe_faults.rs, so that the signatures the
// service checks are not made by the code under test.
const Stripe = require('stripe');

const [secret, timestamp] = process.argv.slice(2);
let payload = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => { payload += chunk; });
process.stdin.on('end', () => {
  const stripe = new Stripe('sk_test_unused');
  process.stdout.write(stripe.webhooks.generateTestHeaderString({
    payload,
    secret,
    timestamp: Number(timestamp),
  }));
});
