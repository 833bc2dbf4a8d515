"""The SSRF guard of web_fetch: which addresses, hosts and URLs are refused (no sockets: DNS
is a fake resolver)."""

from __future__ import annotations

from collections.abc import Sequence
from ipaddress import ip_address

import httpx
import pytest

from worker.tools.ssrf import (
    IPAddress,
    URLRefusedError,
    address_refusal,
    check_destination,
    host_refusal,
    normalize_domain,
)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        # loopback, private, link-local, shared, unique-local: refused unless allowed
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "shared"),
        ("fc00::1", "unique-local"),
        ("fd12:3456::1", "unique-local"),
        ("fec0::1", "site-local"),
        # other non-global ranges (documentation, benchmarking, IETF)
        ("192.0.2.1", "not a public address"),
        ("198.18.0.1", "not a public address"),
        ("203.0.113.7", "not a public address"),
        ("2001:db8::1", "not a public address"),
        # IPv6 forms that carry a private IPv4 address
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:7f00:1", "loopback"),
        ("64:ff9b::a00:1", "carries 10.0.0.1"),
        ("2002:c0a8:101::1", "carries 192.168.1.1"),
    ],
)
def test_non_public_addresses_are_refused_unless_allowed(address: str, reason: str) -> None:
    ip = ip_address(address)
    refusal = address_refusal(ip, allow_private=False)
    assert refusal is not None and reason in refusal, refusal


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("169.254.169.254", "metadata"),
        ("::ffff:169.254.169.254", "metadata"),
        ("::ffff:a9fe:a9fe", "metadata"),
        ("169.254.170.2", "metadata"),
        ("100.100.100.200", "metadata"),
        ("168.63.129.16", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("64:ff9b::a9fe:a9fe", "carries 169.254.169.254"),
        ("2002:a9fe:a9fe::1", "carries 169.254.169.254"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("::", "unspecified"),
        ("::ffff:0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        ("255.255.255.255", "reserved"),
        ("240.0.0.1", "reserved"),
        ("::7f00:1", "reserved"),  # IPv4-compatible 127.0.0.1
        ("::a00:1", "reserved"),
    ],
)
def test_metadata_unspecified_multicast_and_reserved_are_always_refused(
    address: str, reason: str
) -> None:
    ip = ip_address(address)
    for allow_private in (False, True):
        refusal = address_refusal(ip, allow_private=allow_private)
        assert refusal is not None and reason in refusal, (allow_private, refusal)


@pytest.mark.parametrize(
    "address", ["93.184.216.34", "8.8.8.8", "2606:2800:220:1:248:1893:25c8:1946", "::ffff:1.1.1.1"]
)
def test_public_addresses_pass(address: str) -> None:
    assert address_refusal(ip_address(address), allow_private=False) is None


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "10.1.2.3", "::ffff:192.168.0.9"])
def test_allow_private_lets_private_addresses_through(address: str) -> None:
    assert address_refusal(ip_address(address), allow_private=True) is None


@pytest.mark.parametrize(
    ("host", "allow", "deny", "refused"),
    [
        ("example.com", (), (), None),
        ("metadata.google.internal", (), (), "metadata"),
        ("metadata", (), (), "metadata"),
        ("docs.example.com", ("example.com",), (), None),
        ("example.com", ("example.com",), (), None),
        ("badexample.com", ("example.com",), (), "not on the allow-list"),
        ("other.org", ("example.com",), (), "not on the allow-list"),
        ("ads.example.com", ("example.com",), ("ads.example.com",), "deny-list"),
        ("x.ads.example.com", (), ("ads.example.com",), "deny-list"),
    ],
)
def test_host_rules(
    host: str, allow: tuple[str, ...], deny: tuple[str, ...], refused: str | None
) -> None:
    refusal = host_refusal(host, allow_domains=allow, deny_domains=deny)
    if refused is None:
        assert refusal is None
    else:
        assert refusal is not None and refused in refusal


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Example.COM", "example.com"),
        ("*.example.com", "example.com"),
        (".example.com.", "example.com"),
        ("bücher.de", "xn--bcher-kva.de"),
    ],
)
def test_domains_are_normalized(text: str, expected: str) -> None:
    assert normalize_domain(text) == expected


@pytest.mark.parametrize("text", ["", "https://example.com", "example.com/path", "a b", "h:80"])
def test_things_that_are_not_domains_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="not a domain name"):
        normalize_domain(text)


def fake_dns(table: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    async def resolve(host: str, port: int) -> Sequence[IPAddress]:
        if host not in table:
            raise OSError(-2, "Name or service not known")
        return [ip_address(a) for a in table[host]]

    return resolve


DNS = fake_dns(
    {
        "public.test": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"],
        "rebind.test": ["93.184.216.34", "127.0.0.1"],
        "internal.test": ["10.0.0.7"],
        "metadata.test": ["169.254.169.254"],
    }
)


async def check(url: str, **kw: object) -> list[IPAddress]:
    options: dict[str, object] = {"allow_private": False, "resolve": DNS} | kw
    return await check_destination(httpx.URL(url), **options)  # type: ignore[arg-type]


async def test_a_public_name_gives_every_checked_address() -> None:
    assert [str(a) for a in await check("https://public.test/page")] == [
        "93.184.216.34",
        "2606:2800:220:1:248:1893:25c8:1946",
    ]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file:///etc/passwd", "only http and https"),
        ("ftp://public.test/x", "only http and https"),
        ("gopher://public.test/", "only http and https"),
        ("https://user:secret@public.test/", "credentials"),
        ("http://internal.test/", "10.0.0.7 is a private address (internal.test resolves to it)"),
        ("http://rebind.test/", "127.0.0.1 is a loopback address"),
        ("http://metadata.test/", "169.254.169.254 is a cloud metadata address"),
        ("http://169.254.169.254/latest/meta-data/", "cloud metadata address"),
        ("http://[::ffff:10.0.0.1]/", "private address"),
        ("http://127.0.0.1:8080/", "loopback"),
        ("http://metadata.google.internal/", "cloud metadata host"),
        ("http://nowhere.test/", "could not resolve nowhere.test"),
    ],
)
async def test_refused_urls_say_why(url: str, message: str) -> None:
    with pytest.raises(URLRefusedError, match=message.replace("(", r"\(").replace(")", r"\)")):
        await check(url)


async def test_an_ip_literal_is_checked_without_dns_and_obeys_the_allow_list() -> None:
    assert [str(a) for a in await check("http://93.184.216.34/")] == ["93.184.216.34"]
    with pytest.raises(URLRefusedError, match="allow-list"):
        await check("http://93.184.216.34/", allow_domains=("public.test",))
    assert await check("http://public.test/", allow_domains=("public.test",))


@pytest.mark.parametrize("text", ["*", "*.*", "exa*mple.org"])
def test_wildcards_are_refused_with_what_to_do_instead(text: str) -> None:
    with pytest.raises(ValueError, match="wildcards are not supported"):
        normalize_domain(text)


async def test_a_port_out_of_range_is_refused_before_connecting() -> None:
    with pytest.raises(URLRefusedError, match="port 99999 is not a TCP port"):
        await check_destination(httpx.URL("http://127.0.0.1:99999/"), allow_private=True)
