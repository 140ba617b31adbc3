"""PCI-bearing NUMA fit cases for Nova's fit oracle (stdlib only).

The hosts and guests come from the oracle's own generator (gen_cases.py,
next to nova_fit.py); this adds what it leaves thin: device pools of several
vendors and types (type-PCI, type-PF, type-VF, vdpa), pools with no NUMA node,
physical_network and remote_managed tags, guests asking for one or two groups
of devices with a count, alternatives, a device type or a physnet, the NUMA
affinity policy from the flavor, the image or the request itself (now and
then unknown or in conflict), and physnet or tunneled network affinity on
hosts and guests.

    python3 pci_cases.py --seed 8 --n 600 > pci.json
    /usr/bin/python3 $ORACLE/nova_fit.py --check --usage < pci.json > pci.nova.jsonl

--edges writes a fixed set of small cases instead, one per rule of device
fitting (each policy's fallback, PF, vdpa and remote-managed devices, sockets
unknown, physnets, invalid policies); --anchors the oracle's performance
anchors with SR-IOV VFs added, to time against Nova:

    /usr/bin/python3 $ORACLE/nova_fit.py --time 500 < anchors-pci.json

--oracle names the directory of gen_cases.py (default: ../shared/oracle
beside the repository).
"""

import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# (vendor, product, dev_type, carries a physnet)
CATALOG = [
    ('8086', '154d', 'type-VF', True),    # Intel 82599 VF
    ('8086', '154d', 'type-PF', True),    # its PF, same product id
    ('8086', '1572', 'type-PF', True),    # Intel X710 PF
    ('15b3', '101e', 'type-VF', True),    # ConnectX VF
    ('15b3', '101e', 'vdpa', True),       # ConnectX vDPA
    ('10de', '1eb8', 'type-PCI', False),  # a GPU
    ('1af4', '1041', 'type-PCI', False),  # a virtio device
]
PHYSNETS = ['physnet0', 'physnet1', 'physnet2']
POLICIES = ['required', 'legacy', 'preferred', 'socket']


def wchoice(rng, pairs):
    total = sum(w for _, w in pairs)
    r = rng.uniform(0, total)
    acc = 0.0
    for v, w in pairs:
        acc += w
        if r <= acc:
            return v
    return pairs[-1][0]


def gen_pools(rng, ncells):
    pools = []
    for _ in range(wchoice(rng, [(1, 35), (2, 35), (3, 20), (4, 10)])):
        vendor, product, dev_type, net = rng.choice(CATALOG)
        pool = {'vendor_id': vendor, 'product_id': product,
                'dev_type': dev_type,
                'numa_node': None if rng.random() < 0.15
                else rng.randrange(ncells),
                'count': wchoice(rng, [(1, 30), (2, 30), (4, 25), (8, 15)])}
        if net and rng.random() < 0.6:
            pool['physical_network'] = rng.choice(PHYSNETS)
        if dev_type == 'type-VF' and rng.random() < 0.1:
            pool['remote_managed'] = 'true'
        if rng.random() < 0.1:
            pool['address'] = '0000:%02x:00.%d' % (rng.randrange(256),
                                                    rng.randrange(8))
        pools.append(pool)
    return pools


def gen_spec(rng, pools):
    """One alternative of a request: usually a pool the host has."""
    if pools and rng.random() < 0.8:
        p = rng.choice(pools)
        vendor, product, dev_type = (p['vendor_id'], p['product_id'],
                                     p['dev_type'])
        net = p.get('physical_network')
    else:
        vendor, product, dev_type, _ = rng.choice(CATALOG)
        net = rng.choice(PHYSNETS)
    spec = {'vendor_id': vendor, 'product_id': product}
    if rng.random() < 0.35:
        spec['dev_type'] = dev_type
    if net and rng.random() < 0.3:
        spec['physical_network'] = net
    if rng.random() < 0.03:
        spec['remote_managed'] = 'true'
    return spec


def gen_requests(rng, pools):
    reqs = []
    for _ in range(wchoice(rng, [(1, 80), (2, 20)])):
        req = {'count': wchoice(rng, [(1, 60), (2, 30), (3, 10)]),
               'spec': [gen_spec(rng, pools)
                        for _ in range(wchoice(rng, [(1, 85), (2, 15)]))]}
        if rng.random() < 0.15:
            req['numa_policy'] = rng.choice(POLICIES)
        reqs.append(req)
    return reqs


def add_policy(rng, inst):
    es = inst.setdefault('extra_specs', {})
    ip = inst.setdefault('image_props', {})
    es.pop('hw:pci_numa_affinity_policy', None)
    ip.pop('hw_pci_numa_affinity_policy', None)
    r = rng.random()
    if r < 0.5:
        es['hw:pci_numa_affinity_policy'] = rng.choice(POLICIES)
    elif r < 0.6:
        ip['hw_pci_numa_affinity_policy'] = rng.choice(POLICIES)
    elif r < 0.64:
        # the same value in both is allowed, different ones are not
        es['hw:pci_numa_affinity_policy'] = rng.choice(POLICIES)
        ip['hw_pci_numa_affinity_policy'] = rng.choice(POLICIES)
    elif r < 0.66:
        es['hw:pci_numa_affinity_policy'] = rng.choice(
            ['strict', 'Required', 'none'])


def gen_case(rng, gc, i):
    # Lighter hosts than the oracle's default, so that most guests fit on
    # their CPUs and memory and the devices decide.
    host, hmeta = gc.gen_host(rng, pci=False,
                              fill=rng.choice([0, 0, 0.25, 0.5, 0.75]),
                              physnets=PHYSNETS if rng.random() < 0.3
                              else None)
    ncells = len(host['cells'])
    if rng.random() < 0.05:
        del host['cells'][rng.randrange(ncells)]['socket']
    inst, tags = gc.gen_instance(rng, hmeta)
    inst.pop('pci_requests', None)
    kind = wchoice(rng, [('both', 80), ('pools-only', 12),
                         ('requests-only', 8)])
    if kind != 'requests-only':
        host['pci_pools'] = gen_pools(rng, ncells)
    if kind != 'pools-only':
        inst['pci_requests'] = gen_requests(rng, host.get('pci_pools', []))
        add_policy(rng, inst)
    else:
        inst.get('extra_specs', {}).pop('hw:pci_numa_affinity_policy', None)
    if rng.random() < 0.25:
        inst['network_metadata'] = {
            'physnets': sorted(rng.sample(PHYSNETS, rng.randint(0, 2))),
            'tunneled': rng.random() < 0.3}
    tags.update({'host_' + k: v for k, v in hmeta.items()})
    tags['pci_kind'] = kind
    return {'id': 'p%05d' % i, 'host': host, 'instance': inst,
            'limits': {'cpu_allocation_ratio': rng.choice([4.0, 16.0]),
                       'ram_allocation_ratio': rng.choice([1.0, 1.5])},
            'tags': tags}


# ------------------------------------------------------------- edges
def cell(i, cpus, socket=0, mem=8192, pinned=(), net=None):
    c = {'id': i, 'cpus': list(cpus), 'memory_mb': mem,
         'pinned_cpus': list(pinned),
         'mempages': [{'size_kb': 4, 'total': mem * 256, 'used': 0}]}
    if socket is not None:
        c['socket'] = socket
    if net is not None:
        c['network_metadata'] = net
    return c


def four_cells(**kw):
    """Four cells of five CPUs, the first of each shared, on two
    sockets."""
    sockets = kw.get('sockets', [0, 0, 1, 1])
    nets = kw.get('nets', [None] * 4)
    return {'cells': [cell(i, range(5 * i, 5 * i + 5), sockets[i],
                           net=nets[i]) for i in range(4)],
            'cpu_shared_set': '0,5,10,15',
            'cpu_dedicated_set': '1-4,6-9,11-14,16-19'}


def vf(node, count=2, **tags):
    return dict({'vendor_id': '8086', 'product_id': '154d',
                 'dev_type': 'type-VF', 'numa_node': node, 'count': count},
                **tags)


def guest(vcpus=2, nodes=None, policy=None, image_policy=None, reqs=None,
          net=None, dedicated=True):
    es = {}
    if dedicated:
        es['hw:cpu_policy'] = 'dedicated'
    if nodes:
        es['hw:numa_nodes'] = str(nodes)
    if policy:
        es['hw:pci_numa_affinity_policy'] = policy
    inst = {'vcpus': vcpus, 'memory_mb': 1024 * vcpus, 'extra_specs': es}
    if image_policy:
        inst['image_props'] = {'hw_pci_numa_affinity_policy': image_policy}
    if reqs is not None:
        inst['pci_requests'] = reqs
    if net is not None:
        inst['network_metadata'] = net
    return inst


def req(count=1, numa_policy=None, **spec):
    spec = dict({'vendor_id': '8086', 'product_id': '154d'}, **spec)
    r = {'count': count, 'spec': [spec]}
    if numa_policy:
        r['numa_policy'] = numa_policy
    return r


def edge_cases():
    busy = four_cells()
    for c in busy['cells'][:3]:
        c['pinned_cpus'] = c['cpus'][1:4]   # one free pCPU on cells 0-2
    cases = [
        ('order-devices-first', four_cells(), [vf(2)], guest(reqs=[req()])),
        ('order-devices-last', four_cells(), [vf(0), vf(1)], guest()),
        ('required-on-busy-cell', busy, [vf(0)],
         guest(policy='required', reqs=[req()])),
        ('legacy-falls-back-to-no-node', four_cells(), [vf(3, 1), vf(None)],
         guest(vcpus=2, reqs=[req(count=2)])),
        ('legacy-affine-pf-blocks-fallback', four_cells(),
         [dict(vf(0), dev_type='type-PF'), vf(None)],
         guest(reqs=[req()])),
        ('required-no-node-refused', four_cells(), [vf(None)],
         guest(policy='required', reqs=[req()])),
        ('preferred-takes-far-device', busy, [vf(0)],
         guest(policy='preferred', reqs=[req()])),
        ('preferred-mixes-near-and-far', four_cells(), [vf(1, 1), vf(3, 2)],
         guest(policy='preferred', reqs=[req(count=2)])),
        ('socket-same-socket-device', busy, [vf(2)],
         guest(policy='socket', reqs=[req()])),
        ('socket-other-socket-refused', busy, [vf(1)],
         guest(policy='socket', reqs=[req()])),
        ('socket-unknown-refused', four_cells(sockets=[0, 0, None, 1]),
         [vf(1, 1)], guest(policy='socket', reqs=[req(count=2)])),
        ('socket-from-image', busy, [vf(2)],
         guest(image_policy='socket', reqs=[req()])),
        ('request-own-policy', busy, [vf(0)],
         guest(reqs=[req(numa_policy='preferred')])),
        ('flavor-overrides-request-policy', busy, [vf(0)],
         guest(policy='required', reqs=[req(numa_policy='preferred')])),
        ('flavor-image-same-policy', four_cells(), [vf(1)],
         guest(policy='socket', image_policy='socket', reqs=[req()])),
        ('flavor-image-conflict', four_cells(), [vf(1)],
         guest(policy='required', image_policy='legacy', reqs=[req()])),
        ('flavor-policy-unknown', four_cells(), [vf(1)],
         guest(policy='strict', reqs=[req()])),
        ('flavor-policy-unknown-without-devices', four_cells(), [vf(1)],
         guest(policy='strict')),
        ('image-policy-unknown', four_cells(), [vf(1)],
         guest(image_policy='strict', reqs=[req()])),
        ('request-policy-unknown', four_cells(), [vf(1)],
         guest(reqs=[req(numa_policy='strict')])),
        ('pf-not-taken-for-vf-request', four_cells(),
         [dict(vf(0), dev_type='type-PF'), vf(3, 1)],
         guest(policy='required', reqs=[req()])),
        ('pf-requested', four_cells(), [dict(vf(2), dev_type='type-PF')],
         guest(reqs=[req(dev_type='type-PF')])),
        ('vdpa-not-taken-unasked', four_cells(),
         [dict(vf(0), dev_type='vdpa')], guest(reqs=[req()])),
        ('vdpa-requested', four_cells(), [dict(vf(0), dev_type='vdpa')],
         guest(reqs=[req(dev_type='vdpa')])),
        ('remote-managed-not-taken-unasked', four_cells(),
         [vf(1, remote_managed='true')], guest(reqs=[req()])),
        ('remote-managed-requested', four_cells(),
         [vf(1, remote_managed='true')],
         guest(reqs=[req(remote_managed='True')])),
        ('remote-managed-spelled-differently', four_cells(),
         [vf(1, remote_managed='true')],
         guest(reqs=[req(remote_managed='yes')])),
        ('physnet-tag-matches', four_cells(),
         [vf(0, physical_network='physnet0'),
          vf(2, physical_network='PhysNet1')],
         guest(reqs=[req(physical_network='physnet1')])),
        ('two-requests-share-a-pool', four_cells(), [vf(3, 3)],
         guest(policy='required', reqs=[req(count=2), req(count=2)])),
        ('two-cells-two-devices-required', four_cells(),
         [vf(0, 1), vf(3, 1)],
         guest(vcpus=4, nodes=2, policy='required', reqs=[req(count=2)])),
        ('no-pools-on-host', four_cells(), None,
         guest(reqs=[req()])),
        ('no-numa-guest-with-devices', four_cells(), [vf(1)],
         guest(dedicated=False, reqs=[req()])),
        ('no-numa-guest-lacking-devices', four_cells(), [vf(1)],
         guest(dedicated=False, reqs=[req(count=3)])),
        ('physnet-affinity', four_cells(nets=[
            {'physnets': ['physnet0'], 'tunneled': True},
            {'physnets': [], 'tunneled': False},
            {'physnets': ['physnet1'], 'tunneled': False},
            {'physnets': ['physnet1'], 'tunneled': False}]), None,
         guest(net={'physnets': ['physnet1'], 'tunneled': False})),
        ('tunneled-affinity', four_cells(nets=[
            {'physnets': ['physnet0'], 'tunneled': False},
            {'physnets': [], 'tunneled': False},
            {'physnets': [], 'tunneled': True},
            {'physnets': [], 'tunneled': False}]), None,
         guest(net={'physnets': [], 'tunneled': True})),
        ('physnet-nowhere-affine', four_cells(nets=[
            {'physnets': ['physnet0'], 'tunneled': False}, None, None,
            None]), None,
         guest(net={'physnets': ['physnet2'], 'tunneled': False})),
        ('physnet-on-busy-cell', dict(busy, cells=[
            dict(c, network_metadata={'physnets': ['physnet%d' % c['id']],
                                      'tunneled': False})
            for c in busy['cells']]), None,
         guest(vcpus=2, net={'physnets': ['physnet0'], 'tunneled': False})),
        ('physnets-need-two-cells', four_cells(nets=[
            {'physnets': ['physnet0'], 'tunneled': False},
            {'physnets': ['physnet1'], 'tunneled': False}, None, None]),
         None, guest(vcpus=4, nodes=2,
                     net={'physnets': ['physnet0', 'physnet1'],
                          'tunneled': False})),
        ('devices-and-physnet', four_cells(nets=[
            None, {'physnets': ['physnet0'], 'tunneled': False},
            None, None]), [vf(2), vf(1, 1)],
         guest(policy='required',
               net={'physnets': ['physnet0'], 'tunneled': False},
               reqs=[req()])),
    ]
    out = []
    for name, host, pools, inst in cases:
        host = json.loads(json.dumps(host))
        if pools is not None:
            host['pci_pools'] = pools
        out.append({'id': 'pci-' + name, 'host': host, 'instance': inst,
                    'limits': {'cpu_allocation_ratio': 16.0,
                               'ram_allocation_ratio': 1.5}})
    return out


def anchor_cases(gc):
    """The oracle's small and big anchors, with VF pools on some cells and
    a guest asking for VFs under the required policy."""
    by_id = {c['id']: c for c in gc.anchor_cases()}
    small = by_id['small-2x16smt-4vcpu-dedicated']
    small['id'] = 'small-2x16smt-4vcpu-dedicated-vf-required'
    small['host']['pci_pools'] = [
        vf(0, 8, physical_network='physnet0'),
        vf(1, 8, physical_network='physnet1')]
    small['instance']['extra_specs']['hw:pci_numa_affinity_policy'] = \
        'required'
    small['instance']['pci_requests'] = [
        req(count=2, physical_network='physnet1')]
    big = by_id['big-8x32smt-64vcpu-4node-prefer-splitcfg']
    big['id'] = 'big-8x32smt-64vcpu-4node-vf-required'
    big['host']['pci_pools'] = [vf(i, 4, physical_network='physnet0')
                                for i in (1, 3, 5, 7)]
    big['instance']['extra_specs']['hw:pci_numa_affinity_policy'] = \
        'required'
    big['instance']['pci_requests'] = [req(count=4)]
    return [small, big]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--n', type=int, default=100)
    ap.add_argument('--edges', action='store_true')
    ap.add_argument('--anchors', action='store_true')
    ap.add_argument('--oracle', default=os.path.join(
        HERE, '..', '..', '..', '..', 'shared', 'oracle'))
    args = ap.parse_args()
    sys.path.insert(0, args.oracle)
    if args.edges:
        cases = edge_cases()
    elif args.anchors:
        import gen_cases
        cases = anchor_cases(gen_cases)
    else:
        import gen_cases
        rng = random.Random(args.seed)
        cases = [gen_case(rng, gen_cases, i) for i in range(args.n)]
    json.dump(cases, sys.stdout)
    sys.stdout.write('\n')


if __name__ == '__main__':
    main()
