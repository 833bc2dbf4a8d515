"""Where a tool that reads the web may connect: the SSRF guard of ``web_fetch``.

A model chooses the URLs, and the pages it reads can tell it which URLs to choose, so every
destination is checked before a connection is made, on the first request and on every
redirect:

1. the URL: ``http`` or ``https`` only, a host, no credentials;
2. the host name: cloud metadata names are always refused; the deny-list, then (when set) the
   allow-list of domains apply (a listed domain covers its subdomains);
3. the addresses the name resolves to (``check_destination`` resolves DNS itself): every one
   must pass ``address_refusal``, and the caller connects to one of *these* addresses (never
   resolving the name again), so DNS cannot answer differently between check and connect.

``address_refusal`` refuses, always: unspecified (``0.0.0.0/8``, ``::``), multicast,
reserved / broadcast (``240.0.0.0/4``), the IPv4-compatible ``::/8`` block and cloud metadata
addresses (``169.254.169.254``, ...); and unless ``allow_private``: every address that is not
globally reachable (loopback, RFC 1918 private, link-local, shared ``100.64.0.0/10``,
unique-local ``fc00::/7``, documentation and benchmarking ranges, ...). IPv6 forms that carry
an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``,
Teredo ``2001::/32``) are judged by the IPv4 address they carry as well. Sources: the IANA
IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890 and its updates) and the cloud
providers' documented metadata endpoints (AWS, GCP, Azure, Alibaba, Oracle).

Numeric host spellings (``http://2130706433/``, ``http://127.1/``, ``http://0x7f.1/``) need
no special case: they are resolved like names, and the resulting address is what is checked.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

import httpx

from planner.errors import ToolError
from worker.http_url import normalize_domain

__all__ = [
    "METADATA_HOSTS",
    "IPAddress",
    "Resolver",
    "URLRefusedError",
    "address_refusal",
    "check_destination",
    "domain_in",
    "host_refusal",
    "normalize_domain",
    "system_resolve",
]

IPAddress = IPv4Address | IPv6Address

Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]
"""``async (host, port) -> addresses``: DNS resolution, injectable for tests."""


class URLRefusedError(ToolError):
    """A URL or one of its addresses may not be fetched; the message says which rule refused
    it (it is shown to the model)."""


METADATA_HOSTS = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.internal",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
"""Host names of cloud metadata services; refused even with ``allow_private``."""

_ALWAYS_REFUSED: tuple[tuple[IPv4Network | IPv6Network, str], ...] = (
    (IPv4Network("169.254.169.254/32"), "a cloud metadata address"),  # AWS, GCP, Azure, OCI
    (IPv4Network("169.254.170.2/32"), "a cloud metadata address"),  # AWS ECS task metadata
    (IPv4Network("169.254.170.23/32"), "a cloud metadata address"),  # AWS EKS pod identity
    (IPv4Network("100.100.100.200/32"), "a cloud metadata address"),  # Alibaba Cloud
    (IPv4Network("168.63.129.16/32"), "a cloud metadata address"),  # Azure WireServer
    (IPv4Network("192.0.0.192/32"), "a cloud metadata address"),  # Oracle Cloud (legacy)
    (IPv6Network("fd00:ec2::254/128"), "a cloud metadata address"),  # AWS IMDS over IPv6
    (IPv6Network("fd00:ec2::23/128"), "a cloud metadata address"),  # AWS EKS pod identity
    (IPv4Network("0.0.0.0/8"), "an unspecified address"),  # "this network": the local host
    (IPv6Network("::/128"), "an unspecified address"),
    (IPv4Network("224.0.0.0/4"), "a multicast address"),
    (IPv6Network("ff00::/8"), "a multicast address"),
    (IPv4Network("240.0.0.0/4"), "a reserved address"),  # incl. 255.255.255.255
)

_NON_PUBLIC: tuple[tuple[IPv4Network | IPv6Network, str], ...] = (
    (IPv4Network("127.0.0.0/8"), "a loopback address"),
    (IPv6Network("::1/128"), "a loopback address"),
    (IPv4Network("10.0.0.0/8"), "a private address"),
    (IPv4Network("172.16.0.0/12"), "a private address"),
    (IPv4Network("192.168.0.0/16"), "a private address"),
    (IPv6Network("fc00::/7"), "a private (unique-local) address"),
    (IPv4Network("169.254.0.0/16"), "a link-local address"),
    (IPv6Network("fe80::/10"), "a link-local address"),
    (IPv6Network("fec0::/10"), "a site-local address"),
    (IPv4Network("100.64.0.0/10"), "a shared (carrier-grade NAT) address"),
)

_RESERVED_V6 = IPv6Network("::/8")  # IPv4-compatible and other reserved forms
_LOOPBACK_V6 = IPv6Address("::1")
_NAT64 = IPv6Network("64:ff9b::/96")


def address_refusal(ip: IPAddress, *, allow_private: bool) -> str | None:
    """Why ``ip`` may not be connected to (``"10.0.0.1 is a private address"``), or ``None``.

    See the module docstring for the rules; ``allow_private`` lifts only the non-public
    ranges, never metadata, unspecified, multicast or reserved addresses.
    """
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        return address_refusal(ip.ipv4_mapped, allow_private=allow_private)
    for network, what in _ALWAYS_REFUSED:
        if ip.version == network.version and ip in network:
            return f"{ip} is {what}"
    if not allow_private:
        for network, what in _NON_PUBLIC:
            if ip.version == network.version and ip in network:
                return f"{ip} is {what}"
    if isinstance(ip, IPv6Address):
        for carried in _carried_ipv4(ip):
            refusal = address_refusal(carried, allow_private=allow_private)
            if refusal is not None:
                return f"{ip} carries {carried}: {refusal}"
        if ip in _RESERVED_V6 and ip != _LOOPBACK_V6 and ip not in _NAT64:
            return f"{ip} is a reserved (IPv4-compatible) address"
    if not allow_private and not ip.is_global:
        return f"{ip} is not a public address"
    return None


def _carried_ipv4(ip: IPv6Address) -> list[IPv4Address]:
    """IPv4 addresses that an IPv6 address carries (NAT64, 6to4, Teredo server and client)."""
    carried: list[IPv4Address] = []
    if ip in _NAT64:
        carried.append(IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip.sixtofour is not None:
        carried.append(ip.sixtofour)
    if ip.teredo is not None:
        carried.extend(ip.teredo)
    return carried


def domain_in(host: str, domains: Iterable[str]) -> bool:
    """Whether ``host`` (normalized) is one of ``domains`` or a subdomain of one."""
    return any(host == d or host.endswith("." + d) for d in domains)


def host_refusal(
    host: str, *, allow_domains: Sequence[str] = (), deny_domains: Sequence[str] = ()
) -> str | None:
    """Why the host name ``host`` (normalized, see ``normalize_domain``) may not be fetched,
    or ``None``. Metadata names, then ``deny_domains``, then a non-empty ``allow_domains``."""
    if host in METADATA_HOSTS:
        return f"{host} is a cloud metadata host"
    if domain_in(host, deny_domains):
        return f"{host} is on the deny-list of web domains"
    if allow_domains and not domain_in(host, allow_domains):
        return f"{host} is not on the allow-list of web domains ({', '.join(allow_domains)})"
    return None


async def system_resolve(host: str, port: int) -> list[IPAddress]:
    """The addresses of ``host`` from the system resolver (``getaddrinfo``, TCP), in the
    resolver's order (RFC 6724: the families this host can reach first), without duplicates.

    Raises:
        OSError (``socket.gaierror``): the name does not resolve.
    """
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    found: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        ip = ip_address(str(sockaddr[0]).split("%", 1)[0])  # drop an IPv6 scope id
        if ip not in found:
            found.append(ip)
    return found


async def check_destination(
    url: httpx.URL,
    *,
    allow_private: bool,
    allow_domains: Sequence[str] = (),
    deny_domains: Sequence[str] = (),
    resolve: Resolver = system_resolve,
) -> list[IPAddress]:
    """Check ``url`` and resolve its host; return the addresses it may be fetched from (at
    least one, every one checked). Connect to these, never to the name.

    Raises:
        URLRefusedError: the scheme, the credentials, the host or one of its addresses is
            refused, or the host does not resolve; the message names the rule.
    """
    if url.scheme not in ("http", "https"):
        raise URLRefusedError(
            f"refused {url}: only http and https URLs can be fetched, not {url.scheme or '(none)'}"
        )
    if url.userinfo:
        raise URLRefusedError(f"refused a URL with credentials in it (host {url.host})")
    if url.port is not None and not 1 <= url.port <= 65535:
        raise URLRefusedError(f"refused {url}: port {url.port} is not a TCP port (1-65535)")
    raw = url.raw_host.decode("ascii")
    if not raw:
        raise URLRefusedError(f"refused {url}: it names no host")
    literal = _ip_literal(raw)
    name = raw.lower().rstrip(".") if literal is None else str(literal)
    refusal = host_refusal(name, allow_domains=allow_domains, deny_domains=deny_domains)
    if refusal is not None:
        raise URLRefusedError(f"refused {url}: {refusal}")
    port = url.port or (443 if url.scheme == "https" else 80)
    if literal is not None:
        addresses: Sequence[IPAddress] = [literal]
    else:
        try:
            addresses = await resolve(raw, port)
        except OSError as exc:
            raise URLRefusedError(f"could not resolve {raw}: {exc.strerror or exc}") from None
    if not addresses:
        raise URLRefusedError(f"could not resolve {raw}: no addresses")
    for ip in addresses:
        refusal = address_refusal(ip, allow_private=allow_private)
        if refusal is not None:
            where = "" if literal is not None else f" ({raw} resolves to it)"
            raise URLRefusedError(f"refused {url}: {refusal}{where}")
    return list(addresses)


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ip_address(host)
    except ValueError:
        return None
