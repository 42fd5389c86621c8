"""The `auth-ldap` scenario's directory: a private OpenLDAP slapd (Debian
packages slapd and ldap-utils) on a loopback port, loaded with N users and
one group, and a minimal LDAP client (RFC 4511 BER, simple bind and
equality-filter search only) that times the directory's own share of a
login: the operations Portico's LDAP back-end performs for one first login
(src/auth/ldap.rs: service bind, user search, user bind, service bind,
group search), on one connection kept open, as Portico's pool keeps its own.

No system slapd is used: this one runs from a generated slapd.conf with an
mdb database in the bench's work directory and is stopped afterwards.
"""

import os
import socket
import subprocess
import time

BASE = "dc=example,dc=com"
PEOPLE = f"ou=people,{BASE}"
GROUPS = f"ou=groups,{BASE}"
SERVICE_DN = f"cn=portico,{BASE}"
SERVICE_PW = "service-secret"
ROOT_DN = f"cn=admin,{BASE}"
ROOT_PW = "root-secret"
GROUP = "staff"


def user(i):
    return f"user{i:05d}"


def password(i):
    return f"pw-{i:05d}-secret"


def user_dn(i):
    return f"uid={user(i)},{PEOPLE}"


def have_slapd():
    return os.path.exists("/usr/sbin/slapd") and subprocess.run(
        ["sh", "-c", "command -v ldapadd"], capture_output=True).returncode == 0


class Slapd:
    """slapd on 127.0.0.1:`port` with `n` users (all in group `staff`),
    started pinned to `cpu` (the load generator's CPU: the directory is
    not the proxy under test)."""

    def __init__(self, workdir, port, n, cpu):
        self.dir = os.path.join(workdir, "slapd")
        os.makedirs(os.path.join(self.dir, "data"), exist_ok=True)
        self.port = port
        conf = os.path.join(self.dir, "slapd.conf")
        with open(conf, "w") as f:
            f.write("\n".join([
                "include /etc/ldap/schema/core.schema",
                "include /etc/ldap/schema/cosine.schema",
                "include /etc/ldap/schema/inetorgperson.schema",
                "include /etc/ldap/schema/nis.schema",
                "modulepath /usr/lib/ldap",
                "moduleload back_mdb.la",
                f"pidfile {self.dir}/slapd.pid",
                f"argsfile {self.dir}/slapd.args",
                "database mdb",
                "maxsize 268435456",
                f'suffix "{BASE}"',
                f'rootdn "{ROOT_DN}"',
                f"rootpw {ROOT_PW}",
                f"directory {self.dir}/data",
                "index uid eq",
                "index member eq",
                "access to attrs=userPassword by self write by anonymous auth by * none",
                "access to * by * read",
                ""]))
        self.log = open(os.path.join(self.dir, "slapd.log"), "ab")
        self.proc = subprocess.Popen(
            ["taskset", "-c", cpu, "/usr/sbin/slapd", "-d", "0", "-f", conf,
             "-h", f"ldap://127.0.0.1:{port}/"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log,
            start_new_session=True)
        deadline = time.time() + 15
        while True:
            try:
                c = Conn(port)
                c.bind("", "")
                c.close()
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.stop()
                    raise RuntimeError(f"slapd did not start: {self.tail()}")
                time.sleep(0.05)
        self.load(n)

    def load(self, n):
        ldif = [f"dn: {BASE}\nobjectClass: dcObject\nobjectClass: organization\no: Example\n"
                f"dc: example\n",
                f"dn: {PEOPLE}\nobjectClass: organizationalUnit\nou: people\n",
                f"dn: {GROUPS}\nobjectClass: organizationalUnit\nou: groups\n",
                f"dn: {SERVICE_DN}\nobjectClass: organizationalRole\n"
                f"objectClass: simpleSecurityObject\ncn: portico\nuserPassword: {SERVICE_PW}\n"]
        for i in range(n):
            ldif.append(f"dn: {user_dn(i)}\nobjectClass: inetOrgPerson\nuid: {user(i)}\n"
                        f"cn: {user(i)}\nsn: {user(i)}\nuserPassword: {password(i)}\n")
        ldif.append(f"dn: cn={GROUP},{GROUPS}\nobjectClass: groupOfNames\ncn: {GROUP}\n" +
                    "".join(f"member: {user_dn(i)}\n" for i in range(n)))
        p = subprocess.run(["ldapadd", "-x", "-H", f"ldap://127.0.0.1:{self.port}/",
                            "-D", ROOT_DN, "-w", ROOT_PW],
                           input="\n".join(ldif).encode(), capture_output=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"ldapadd failed: {p.stderr.decode()[-500:]}")

    def tail(self):
        try:
            with open(os.path.join(self.dir, "slapd.log"), "rb") as f:
                return f.read()[-800:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


# ---- a minimal LDAP client (RFC 4511, BER as X.690 definite lengths)

def _len(n):
    if n < 0x80:
        return bytes([n])
    b = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(b)]) + b


def _tlv(tag, body):
    return bytes([tag]) + _len(len(body)) + body


def _int(tag, v):
    return _tlv(tag, v.to_bytes(max(1, (v.bit_length() + 8) // 8), "big"))


def _str(tag, s):
    return _tlv(tag, s.encode())


class Conn:
    """One LDAP connection: `bind` and `search` (equality filter), each
    waiting for its result; raises on a non-success result code."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        self.msgid = 0

    def close(self):
        self.sock.close()

    def _send(self, op):
        self.msgid += 1
        self.sock.sendall(_tlv(0x30, _int(0x02, self.msgid) + op))

    def _message(self):
        """The next LDAPMessage: (protocolOp tag, its body)."""
        while True:
            if len(self.buf) >= 2:
                n, hdr = self.buf[1], 2
                if n & 0x80:
                    k = n & 0x7F
                    if len(self.buf) >= 2 + k:
                        n, hdr = int.from_bytes(self.buf[2:2 + k], "big"), 2 + k
                    else:
                        n = None
                if n is not None and len(self.buf) >= hdr + n:
                    msg, self.buf = self.buf[hdr:hdr + n], self.buf[hdr + n:]
                    # messageID INTEGER, then the protocolOp.
                    i = 2 + msg[1]
                    tag, ln, j = msg[i], msg[i + 1], i + 2
                    if ln & 0x80:
                        k = ln & 0x7F
                        ln, j = int.from_bytes(msg[j:j + k], "big"), j + k
                    return tag, msg[j:j + ln]
            chunk = self.sock.recv(65536)
            if not chunk:
                raise OSError("the directory closed the connection")
            self.buf += chunk

    @staticmethod
    def _check(what, body):
        # LDAPResult: resultCode ENUMERATED first.
        code = body[2]
        if body[0] != 0x0A or code != 0:
            raise RuntimeError(f"LDAP {what}: result code {code}")

    def bind(self, dn, pw):
        self._send(_tlv(0x60, _int(0x02, 3) + _str(0x04, dn) + _str(0x80, pw)))
        tag, body = self._message()
        if tag != 0x61:
            raise RuntimeError(f"LDAP bind: unexpected answer tag {tag:#x}")
        self._check("bind", body)

    def search(self, base, attr, value, want):
        """Subtree search for (attr=value) asking for the attribute `want`
        (as Portico asks); returns the number of entries."""
        filt = _tlv(0xA3, _str(0x04, attr) + _str(0x04, value))
        op = _tlv(0x63, _str(0x04, base) + _int(0x0A, 2) + _int(0x0A, 0) + _int(0x02, 0) +
                  _int(0x02, 0) + _tlv(0x01, b"\x00") + filt + _tlv(0x30, _str(0x04, want)))
        self._send(op)
        entries = 0
        while True:
            tag, body = self._message()
            if tag == 0x64:
                entries += 1
            elif tag == 0x65:
                self._check("search", body)
                return entries
            elif tag != 0x73:   # a search reference: not expected here
                raise RuntimeError(f"LDAP search: unexpected answer tag {tag:#x}")


def one_login(conn, i):
    """The directory operations of one first login, as Portico performs
    them (src/auth/ldap.rs): find the user as the service account, bind as
    the user, bind back, find the user's groups."""
    conn.bind(SERVICE_DN, SERVICE_PW)
    if conn.search(PEOPLE, "uid", user(i), "uid") != 1:
        raise RuntimeError(f"{user(i)} not found")
    conn.bind(user_dn(i), password(i))
    conn.bind(SERVICE_DN, SERVICE_PW)
    if conn.search(GROUPS, "member", user_dn(i), "cn") != 1:
        raise RuntimeError(f"{user(i)}: group not found")
