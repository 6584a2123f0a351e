//! The table of credential shapes the redactor is held to: for each, a true positive in the
//! context an agent would paste it in, and a near miss that must pass untouched. Cloud, forge,
//! chat, payment and AI-provider keys, Relay's own tokens of every kind, JWTs, connection
//! strings, headers and command lines, and the evasions: split by zero-width characters,
//! URL-encoded, escaped in JSON strings or HTML.
//!
//! The values are made up (a seeded generator fills them to each shape's length); none is live.

use base64::Engine;

use super::redact;

/// One shape: `before`, the secret, `after`; the kind its marker names; a near miss.
struct Shape {
    name: &'static str,
    before: String,
    secret: String,
    after: String,
    kind: &'static str,
    near_miss: String,
}

/// Made-up values, the same on every run.
struct Fake(u64);

const UPPER: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
const LOWER: &str = "abcdefghijklmnopqrstuvwxyz";
const DIGITS: &str = "0123456789";
const HEX: &str = "0123456789abcdef";

impl Fake {
    fn from(&mut self, alphabet: &str, len: usize) -> String {
        let alphabet: Vec<char> = alphabet.chars().collect();
        (0..len)
            .map(|_| {
                self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                alphabet[(self.0 >> 33) as usize % alphabet.len()]
            })
            .collect()
    }
    fn alnum(&mut self, len: usize) -> String {
        self.from(&format!("{UPPER}{LOWER}{DIGITS}"), len)
    }
    fn hex(&mut self, len: usize) -> String {
        self.from(HEX, len)
    }
    fn upper_alnum(&mut self, len: usize) -> String {
        self.from(&format!("{UPPER}{DIGITS}"), len)
    }
    /// AWS key ids' alphabet.
    fn base32(&mut self, len: usize) -> String {
        self.from("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", len)
    }
    fn url_safe(&mut self, len: usize) -> String {
        self.from(&format!("{UPPER}{LOWER}{DIGITS}_-"), len)
    }
    fn base64(&mut self, len: usize) -> String {
        self.from(&format!("{UPPER}{LOWER}{DIGITS}+/"), len)
    }
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn shapes() -> Vec<Shape> {
    let f = &mut Fake(0x5eed);
    let mut table = Vec::new();
    let mut shape = |name, before: &str, secret: String, after: &str, kind, near_miss: &str| {
        table.push(Shape {
            name,
            before: before.to_owned(),
            secret,
            after: after.to_owned(),
            kind,
            near_miss: near_miss.to_owned(),
        });
    };
    let pem = |label: &str, body: &str| format!("-----BEGIN {label}-----\n{body}\n-----END {label}-----");

    // Keys.
    let rsa_body = format!("MIIEpAIBAAKCAQEA{}\n{}", f.base64(48), f.base64(64));
    shape(
        "RSA private key",
        "the deploy key:\n",
        pem("RSA PRIVATE KEY", &rsa_body),
        "\nuse it once",
        "private-key",
        "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8A\n-----END PUBLIC KEY-----",
    );
    shape(
        "OpenSSH private key",
        "",
        pem("OPENSSH PRIVATE KEY", &format!("b3BlbnNzaC1rZXktdjEAAAAA{}", f.base64(40))),
        "",
        "private-key",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0cGsUFMIKWlVhZm9vYmFy me@laptop",
    );
    shape(
        "PGP private key block",
        "",
        pem("PGP PRIVATE KEY BLOCK", &format!("lQOYBF{}", f.base64(60))),
        "",
        "private-key",
        "-----BEGIN PGP SIGNATURE-----\niQEzBAEBCAAdFiEE\n-----END PGP SIGNATURE-----",
    );
    shape(
        "private key in a service account's JSON",
        r#"{"type": "service_account", "private_key": ""#,
        format!(r"-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg{}\n-----END PRIVATE KEY-----", f.base64(60)),
        r#"\n"}"#,
        "private-key",
        r#"{"type": "service_account", "private_key_id": "key id 1"}"#,
    );
    let key_data = b64(&pem("RSA PRIVATE KEY", &format!("MIIEowIBAAKCAQEA{}", f.base64(40))));
    shape(
        "kubeconfig client-key-data (base64 PEM)",
        "    client-key-data: ",
        key_data,
        "",
        "private-key",
        &format!("    client-certificate-data: {}", b64(&pem("CERTIFICATE", "MIIC+zCCAeOgAwIBAgIJ"))),
    );
    shape(
        "age secret key",
        "",
        format!("AGE-SECRET-KEY-1{}", f.from("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L", 58)),
        "",
        "age-secret-key",
        "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p is my public key",
    );

    // Relay's own tokens, every kind.
    for (name, prefix) in [
        ("Relay machine token", "rlm_"),
        ("Relay session token", "rls_"),
        ("Relay human token", "rlh_"),
        ("Relay spawn grant", "rlg_"),
        ("Relay job token", "rlj_"),
        ("Relay console session", "rlc_"),
    ] {
        shape(
            name,
            "RELAY_TOKEN=",
            format!("{prefix}{}", f.hex(64)),
            "",
            "relay-token",
            &format!("tokens start {prefix} and 64 hex digits follow"),
        );
    }

    // Cloud.
    shape(
        "AWS access key id",
        "export AWS_ACCESS_KEY_ID=",
        format!("AKIA{}", f.base32(16)),
        "",
        "aws-access-token",
        "AKIA is how AWS key ids start, e.g. AKIAEXAMPLE",
    );
    shape(
        "AWS temporary key id in JSON",
        r#"{"AccessKeyId": ""#,
        format!("ASIA{}", f.base32(16)),
        r#""}"#,
        "aws-access-token",
        r#"{"AccessKeyId": "ASIA-temporary"}"#,
    );
    shape(
        "AWS secret access key",
        "aws_secret_access_key = ",
        f.base64(40),
        "",
        "aws-secret-key",
        "aws_secret_access_key is read from ~/.aws/credentials",
    );
    shape(
        "AWS session token",
        "aws_session_token = ",
        format!("IQoJb3JpZ2luX2VjE{}", f.base64(120)),
        "",
        "secret",
        "aws_session_token is optional for long-lived keys",
    );
    shape(
        "Google API key",
        "maps key ",
        format!("AIza{}", f.url_safe(35)),
        " in the app",
        "gcp-api-key",
        "AIza is how a Google API key starts",
    );
    shape(
        "Google OAuth client secret",
        "client_secret ",
        format!("GOCSPX-{}", f.url_safe(28)),
        "",
        "google-oauth",
        "GOCSPX- is the prefix of Google client secrets",
    );
    shape(
        "Google OAuth access token",
        "token is ",
        format!("ya29.{}", f.url_safe(80)),
        "",
        "google-oauth",
        "ya29 is the prefix; the rest is opaque",
    );
    shape(
        "Azure storage account key",
        "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=",
        format!("{}==", f.base64(86)),
        ";EndpointSuffix=core.windows.net",
        "azure-storage-key",
        "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=<key>",
    );
    shape(
        "Azure SAS signature",
        "https://acme.blob.core.windows.net/c/f?sv=2022-11-02&sig=",
        format!("{}%2B{}%3D", f.alnum(30), f.alnum(12)),
        "&se=2026",
        "azure-sas",
        "https://acme.blob.core.windows.net/c/f?sv=2022-11-02&sig=short",
    );
    shape(
        "Azure AD client secret",
        "AZURE_CLIENT_SECRET ",
        format!("{}8Q~{}", f.alnum(3), f.url_safe(34)),
        "",
        "azure-ad-client-secret",
        "the secret ends in Q~ and 34 characters",
    );
    shape(
        "DigitalOcean token",
        "",
        format!("dop_v1_{}", f.hex(64)),
        "",
        "digitalocean-pat",
        "dop_v1_ tokens are 64 hex digits",
    );
    shape(
        "Heroku API key",
        "HEROKU_API_KEY ",
        format!("HRKU-{}", f.url_safe(60)),
        "",
        "heroku-key",
        "HRKU- is how new Heroku keys start",
    );
    shape(
        "Fly.io token",
        "",
        format!("fo1_{}", f.url_safe(43)),
        "",
        "flyio-access-token",
        "fo1_ tokens come from fly tokens create",
    );
    shape(
        "Supabase token",
        "",
        format!("sbp_{}", f.hex(40)),
        "",
        "supabase-token",
        "sbp_ is a Supabase access token prefix",
    );
    shape(
        "Databricks token",
        "DATABRICKS ",
        format!("dapi{}", f.hex(32)),
        "",
        "databricks-api-token",
        "the dapi endpoint answered 200",
    );
    shape(
        "Vault token",
        "VAULT ",
        format!("hvs.{}", f.url_safe(90)),
        "",
        "vault-service-token",
        "hvs.example is not a token",
    );
    shape(
        "Terraform Cloud token",
        "",
        format!("{}.atlasv1.{}", f.alnum(14), f.url_safe(67)),
        "",
        "hashicorp-tf-api-token",
        "app.terraform.io atlasv1 API",
    );
    shape(
        "Doppler token",
        "",
        format!("dp.pt.{}", f.alnum(43)),
        "",
        "doppler-api-token",
        "dp.pt. is a Doppler personal token",
    );
    shape("Pulumi token", "", format!("pul-{}", f.hex(40)), "", "pulumi-api-token", "pul-request merged");
    shape(
        "API token by name",
        "CLOUDFLARE_API_TOKEN=",
        f.url_safe(40),
        "",
        "cloudflare-api-key",
        "CLOUDFLARE_API_TOKEN_FILE=/run/secrets/cf",
    );

    // Forges and package registries.
    shape(
        "GitHub classic PAT",
        "use ",
        format!("ghp_{}", f.alnum(36)),
        " to push",
        "github-pat",
        "ghp_ tokens are 40 characters long",
    );
    shape(
        "GitHub fine-grained PAT",
        "",
        format!("github_pat_11{}_{}", f.alnum(20), f.alnum(59)),
        "",
        "github-fine-grained-pat",
        "github_pat_ is the fine-grained prefix",
    );
    shape(
        "GitHub app installation token",
        "GH ",
        format!("ghs_{}", f.alnum(36)),
        "",
        "github-app-token",
        "ghs_ expires in an hour",
    );
    shape(
        "GitHub token as 40 hex digits by name",
        "export GH_TOKEN=",
        f.hex(40),
        "",
        "github-token",
        &format!("GITHUB_SHA={}", f.hex(40)),
    );
    shape(
        "GitLab PAT",
        "GITLAB_TOKEN: ",
        format!("glpat-{}", f.url_safe(20)),
        "",
        "gitlab-pat",
        "glpat- tokens expire after a year",
    );
    shape(
        "GitLab runner token",
        "",
        format!("glrt-{}", f.url_safe(20)),
        "",
        "gitlab-runner-authentication-token",
        "glrt- runners register",
    );
    shape(
        "Atlassian API token",
        "",
        format!("ATATT3xFfGF0{}", f.url_safe(180)),
        "",
        "atlassian-api-token",
        "ATATT is the Atlassian prefix",
    );
    shape(
        "npm token in .npmrc",
        "//registry.npmjs.org/:_authToken=",
        format!("npm_{}", f.alnum(36)),
        "",
        "npm-access-token",
        "//registry.npmjs.org/:_authToken=${NPM_TOKEN}",
    );
    shape(
        "PyPI token",
        "password = ",
        format!("pypi-AgEIcHlwaS5vcmc{}", f.url_safe(70)),
        "",
        "pypi-upload-token",
        "username = __token__",
    );
    shape("RubyGems key", "", format!("rubygems_{}", f.hex(48)), "", "rubygems-api-token", "rubygems_version is 3.5");
    shape(
        "Docker Hub PAT",
        "docker login -u me -p ",
        format!("dckr_pat_{}", f.url_safe(27)),
        "",
        "docker-token",
        "docker login -u me --password-stdin",
    );
    shape(
        "NuGet key",
        "",
        format!("oy2{}", f.from(&format!("{LOWER}{DIGITS}"), 43)),
        "",
        "nuget-key",
        "oy2 is where NuGet keys begin",
    );

    // Chat.
    shape(
        "Slack bot token",
        "bot token ",
        format!("xoxb-{}-{}-{}", f.from(DIGITS, 12), f.from(DIGITS, 13), f.alnum(24)),
        "",
        "slack-bot-token",
        "xoxb- tokens belong to bots",
    );
    shape(
        "Slack app token",
        "SLACK_APP_TOKEN=",
        format!("xapp-1-A{}-{}-{}", f.upper_alnum(10), f.from(DIGITS, 13), f.hex(64)),
        "",
        "slack-app-token",
        "xapp-level tokens",
    );
    shape(
        "Slack webhook",
        "post to ",
        format!("https://hooks.slack.com/services/T{}/B{}/{}", f.upper_alnum(8), f.upper_alnum(10), f.alnum(24)),
        " now",
        "slack-webhook-url",
        "see https://hooks.slack.com/ for the docs",
    );
    shape(
        "Discord webhook",
        "",
        format!("https://discord.com/api/webhooks/{}/{}", f.from(DIGITS, 18), f.url_safe(68)),
        "",
        "discord-webhook",
        "https://discord.com/api/webhooks is the endpoint",
    );
    shape(
        "Discord bot token",
        "discord bot token ",
        format!("M{}.{}.{}", f.url_safe(25), f.url_safe(6), f.url_safe(38)),
        "",
        "discord-token",
        "discord bot started",
    );
    shape(
        "Telegram bot token",
        "BOT=",
        format!("{}:AA{}", f.from(DIGITS, 10), f.url_safe(33)),
        "",
        "telegram-token",
        "at 12:30 the bot AA meeting",
    );

    // Payments.
    shape(
        "Stripe live secret key",
        "stripe.api_key = '",
        format!("sk_live_{}", f.alnum(24)),
        "'",
        "stripe-access-token",
        "sk_live_ keys never go in the client",
    );
    shape(
        "Stripe restricted key",
        "",
        format!("rk_live_{}", f.alnum(24)),
        "",
        "stripe-access-token",
        "rk_live_ is restricted",
    );
    shape(
        "Stripe webhook secret",
        "STRIPE_WEBHOOK ",
        format!("whsec_{}", f.alnum(32)),
        "",
        "stripe-webhook-secret",
        "whsec_ signs the webhook",
    );
    shape(
        "Square access token",
        "",
        format!("sq0atp-{}", f.url_safe(22)),
        "",
        "square-access-token",
        "sq0atp- is sandbox or prod",
    );
    shape(
        "Braintree access token",
        "",
        format!("access_token$production${}${}", f.from(&format!("{LOWER}{DIGITS}"), 16), f.hex(32)),
        "",
        "braintree-token",
        "access_token$production$ is the prefix",
    );
    shape(
        "Shopify admin token",
        "",
        format!("shpat_{}", f.hex(32)),
        "",
        "shopify-access-token",
        "shpat_ tokens are admin API",
    );

    // Mail, messaging and other services.
    shape(
        "SendGrid key",
        "",
        format!("SG.{}.{}", f.url_safe(22), f.url_safe(43)),
        "",
        "sendgrid-api-token",
        "SG.example.com resolves",
    );
    shape("Mailgun key", "", format!("key-{}", f.hex(32)), "", "mailgun-key", "the key-value store");
    shape("Mailchimp key", "", format!("{}-us21", f.hex(32)), "", "mailchimp-key", "the data center is us21");
    shape("Twilio API key", "", format!("SK{}", f.hex(32)), "", "twilio-api-key", "SKU 1234 in stock");
    shape(
        "Postman key",
        "",
        format!("PMAK-{}-{}", f.hex(24), f.hex(34)),
        "",
        "postman-api-token",
        "PMAK- is Postman's prefix",
    );
    shape("New Relic key", "", format!("NRAK-{}", f.upper_alnum(27)), "", "newrelic-key", "NRAK- is a user key");
    shape("Sentry token", "", format!("sntrys_eyJpYXQiOjE3{}", f.base64(80)), "", "sentry-token", "sntrys_ org tokens");
    shape(
        "Grafana service account token",
        "",
        format!("glsa_{}_{}", f.alnum(32), f.hex(8)),
        "",
        "grafana-service-account-token",
        "glsa_ is Grafana's prefix",
    );
    shape("Linear key", "", format!("lin_api_{}", f.alnum(40)), "", "linear-api-key", "lin_api_ keys for Linear");
    shape(
        "Notion token",
        "",
        format!("ntn_{}{}", f.from(DIGITS, 11), f.alnum(35)),
        "",
        "notion-api-token",
        "ntn_ is Notion's prefix",
    );
    shape(
        "1Password service account token",
        "",
        format!("ops_eyJ{}", f.base64(300)),
        "",
        "1password-service-account-token",
        "ops_eyJ starts a service account token",
    );
    shape(
        "Dynatrace token",
        "",
        format!("dt0c01.{}.{}", f.upper_alnum(24), f.upper_alnum(64)),
        "",
        "dynatrace-api-token",
        "dt0c01 is the token format",
    );
    shape("Facebook access token", "", format!("EAA{}", f.alnum(160)), "", "facebook-token", "EAAB is how they start");
    shape(
        "X (Twitter) bearer token",
        "",
        format!("{}{}%3D{}", "A".repeat(22), f.alnum(40), f.alnum(50)),
        "",
        "twitter-token",
        "AAAAAAAAAA is ten As",
    );
    shape(
        "Mapbox secret token",
        "",
        format!("sk.eyJ1Ijoi{}.{}", f.url_safe(40), f.url_safe(22)),
        "",
        "mapbox-token",
        "pk.eyJ1 public tokens are fine",
    );

    // AI providers.
    shape(
        "OpenAI project key",
        "OPENAI_API_KEY=",
        format!("sk-proj-{}", f.url_safe(48)),
        "",
        "openai-key",
        "use sk-learn or the task-runner-for-everything-you-need",
    );
    let anthropic = format!("sk-ant-api03-{}AA", f.url_safe(93));
    shape(
        "Anthropic key",
        "ANTHROPIC_API_KEY=\"",
        anthropic,
        "\"",
        "anthropic-api-key",
        "sk-ant- keys are for the API",
    );
    shape("Hugging Face token", "", format!("hf_{}", f.alnum(34)), "", "huggingface-token", "hf_hub_download(repo_id)");
    shape("Groq key", "", format!("gsk_{}", f.alnum(52)), "", "groq-key", "gsk_ keys are Groq's");
    shape("xAI key", "", format!("xai-{}", f.alnum(80)), "", "xai-key", "xai-sdk installed");
    shape("Replicate token", "", format!("r8_{}", f.alnum(37)), "", "replicate-token", "r8_ is Replicate's prefix");
    shape("Perplexity key", "", format!("pplx-{}", f.alnum(48)), "", "perplexity-api-key", "pplx-api docs");

    // Generic: tokens, URLs, headers, command lines, assignments.
    shape(
        "JWT",
        "cookie ",
        format!("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ{}.{}", f.url_safe(20), f.url_safe(43)),
        "",
        "jwt",
        "eyJhbGciOi is how a JWT header begins",
    );
    shape("Bearer header", "curl -H 'Authorization: Bearer ", f.hex(32), "'", "bearer-token", "bearer of bad news");
    shape(
        "password in prose",
        "the staging db password is ",
        "hunter2x".to_owned(),
        ". Rotate it after",
        "password",
        "the password is required for every sign-in",
    );
    shape(
        "Docker config.json login",
        r#"{"auths": {"https://index.docker.io/v1/": {"auth": ""#,
        b64("deploy:Wd8!kz2Lq"),
        r#""}}}"#,
        "docker-auth",
        r#"{"auths": {"ghcr.io": {"auth": "", "email": "me@example.com"}}}"#,
    );
    shape(
        "Bearer header in a request",
        "GET /v1/me HTTP/1.1\nAuthorization: Bearer ",
        f.url_safe(40),
        "\nAccept: */*",
        "bearer-token",
        "the bearer of the news",
    );
    shape(
        "Basic auth header",
        "Authorization: Basic ",
        b64("deploy:Wd8!kz2Lq"),
        "",
        "basic-auth",
        "basic instructions follow",
    );
    shape(
        "Okta API token",
        "Authorization: SSWS ",
        format!("00{}", f.url_safe(40)),
        "",
        "okta-token",
        "SSWS is Okta's scheme",
    );
    shape(
        "Postgres URL password",
        "DATABASE_URL=postgres://app:",
        "s3cr3t-pw".to_owned(),
        "@db.internal:5432/app",
        "connection-password",
        "postgres://app@db.internal/app has no password",
    );
    shape(
        "Redis URL password",
        "redis://:",
        "hunter2".to_owned(),
        "@localhost:6379/0",
        "connection-password",
        "https://example.com:8443/path is up",
    );
    shape(
        "MongoDB SRV URL password",
        "mongodb+srv://admin:",
        "Pa55w0rd".to_owned(),
        "@cluster0.mongodb.net/app",
        "connection-password",
        "mongodb+srv://cluster0.mongodb.net/app",
    );
    shape("password in .env", "DB_PASSWORD=", "hunter2".to_owned(), "", "password", "DB_PASSWORD_FILE=/run/secrets/db");
    shape("password in YAML", "redis:\n  password: ", "Tr0ub4dor&3".to_owned(), "", "password", "  password: String,");
    shape("mysql -p", "mysql -u root -p", "Hunter2hunter".to_owned(), " app", "password", "mysql -u root -p app");
    shape(
        "curl -u",
        "curl -u deploy:",
        "Wd8kz2Lq".to_owned(),
        " https://ci.example.com",
        "password",
        "curl -u deploy https://ci.example.com",
    );
    shape("client secret by name", "CLIENT_SECRET=", f.base64(24), "", "secret", "client_secret: <from the vault>");

    // Evasions.
    shape(
        "split by a zero-width space",
        "use ",
        format!("ghp_{}\u{200B}{}", f.alnum(16), f.alnum(20)),
        " to push",
        "github-pat",
        "a\u{200B}b",
    );
    shape(
        "split by word joiners",
        "",
        format!("AKIA\u{2060}{}\u{FEFF}{}", f.base32(8), f.base32(8)),
        "",
        "aws-access-token",
        "x\u{2060}y\u{FEFF}z and ok",
    );
    shape(
        "URL-encoded token",
        "https://api.example.com/?t=",
        format!("ghp%5F{}", f.alnum(36)),
        "",
        "github-pat",
        "https://api.example.com/?q=100%25",
    );
    shape(
        "URL-encoded assignment",
        "https://example.com/login?q=password%3D",
        "Wd8kz2Lq".to_owned(),
        "",
        "password",
        "https://example.com/login?q=password%3D%24PASS",
    );
    shape(
        "JSON \\u escape",
        r#"{"t": ""#,
        format!(r"ghp\u005f{}", f.alnum(36)),
        r#""}"#,
        "github-pat",
        r#"{"t": "ghp\u005fshort"}"#,
    );
    shape(
        "JSON escaped quotes",
        r#""{\"api_key\": "#,
        format!(r#"\"{}\""#, f.alnum(24)),
        r#"}""#,
        "secret",
        r#""{\"api_key\": \"\"}""#,
    );
    shape(
        "JSON escaped slashes",
        r#"{"hook": ""#,
        format!(r"https:\/\/hooks.slack.com\/services\/T{}\/B{}\/{}", f.upper_alnum(8), f.upper_alnum(10), f.alnum(24)),
        r#""}"#,
        "slack-webhook-url",
        r#"{"docs": "https:\/\/api.slack.com"}"#,
    );
    shape(
        "HTML entity",
        "<code>",
        format!("ghp&#95;{}", f.alnum(36)),
        "</code>",
        "github-pat",
        "<code>ghp&#95;</code> is the prefix",
    );
    table
}

#[test]
fn every_shape_is_caught_and_its_near_miss_left_alone() {
    let table = shapes();
    let mut missed = Vec::new();
    for shape in &table {
        let input = format!("{}{}{}", shape.before, shape.secret, shape.after);
        let expected = format!("{}[REDACTED:{}]{}", shape.before, shape.kind, shape.after);
        let out = redact(&input);
        if out.text.as_str() != expected {
            missed.push(format!("{}: {input:?} came out {:?}", shape.name, out.text.as_str()));
        }
        let near = redact(&shape.near_miss);
        if near.total() != 0 {
            missed.push(format!("{} (near miss): {:?} came out {:?}", shape.name, shape.near_miss, near.text.as_str()));
        }
    }
    println!(
        "Relay's table: {} of {} shapes caught, as written and as the evasions hide them; {} of {} near misses left alone",
        table.len() - missed.iter().filter(|m| !m.contains("(near miss)")).count(),
        table.len(),
        table.len() - missed.iter().filter(|m| m.contains("(near miss)")).count(),
        table.len()
    );
    assert!(table.len() >= 75, "the table holds {} shapes", table.len());
    assert!(missed.is_empty(), "{} of {} shapes failed:\n{}", missed.len(), table.len(), missed.join("\n"));
}

#[test]
fn every_rule_is_in_the_table() {
    let table = shapes();
    for rule in super::rules::OWN_TOKENS.iter().chain(super::rules::OWN_SHAPES) {
        assert!(table.iter().any(|s| s.kind == rule.kind), "no shape in the table for {}", rule.kind);
    }
}
